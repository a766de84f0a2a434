"""Run the app under uvicorn on a socket the command bound before anything else.

Binding first means a busy port is one clear error before migrations run, and the app's
"server ready" line (logged at start-up, after the socket listens) is true when it appears:
uvicorn binds only after the app's start-up, so with a busy port it would announce the app
ready and then fail.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket

import uvicorn
from uvicorn.supervisors import Multiprocess

from shardstream.errors import ConfigError
from shardstream.server.config import Settings

log = logging.getLogger("shardstream.server")

_APP = "shardstream.server.app:create_app"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), or a ConfigError naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # As uvicorn does: a restarted server may bind while old connections sit in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use") from exc
        raise ConfigError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)  # the worker processes serve it too
    return sock


def serve(settings: Settings, sock: socket.socket) -> bool:
    """Serve the app (built by each worker from the environment) on ``sock`` until stopped.

    Returns whether the server started (False: the app's start-up failed; it logged why).
    """
    config = uvicorn.Config(
        _APP,
        factory=True,
        workers=settings.workers,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        # Longer than the idle timeout of common load balancers (60 s), and long enough that
        # a busy client's pooled connection is not closed under it between two requests.
        timeout_keep_alive=75,
    )
    sock.listen(config.backlog)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"
    log.info("listening on %s", url)
    # uvicorn stops gracefully on Ctrl-C, then raises the signal again: it was expected.
    if settings.workers > 1:
        with contextlib.suppress(KeyboardInterrupt):
            Multiprocess(config, sockets=[sock]).run()  # restarts workers that die
        return True
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    return server.started
