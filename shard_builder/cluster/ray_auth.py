"""Ray's token authentication, as a build meets it: both modes work, and a failure says why.

Ray 2.5x turns token authentication on for a ``ray start --head`` whenever the head
machine has a token (``~/.ray/auth_token``; a ``ray.init()`` of a new local instance
writes one). A driver that joins ``HOST:PORT`` sends a token only when its own
``RAY_AUTH_MODE`` says ``token``; otherwise the cluster answers ``InvalidAuthToken`` for
20 s and ``ray.init`` ends in a bare "failed to connect". So, before joining,
:func:`join_settings` asks the cluster's GCS (one call of Ray's own client, without and
then with this machine's token) whether it uses tokens, and sets the driver's mode to
match, or stops with an error that names the cause and the fix.

A ``--ray local`` try-out keeps token authentication on, with a token made for the run and
passed to the processes Ray starts through the environment (:func:`local_settings`): no
``~/.ray/auth_token`` is written, so later ``ray start --head`` clusters are not switched to
token authentication by it.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardstream.errors import ConfigError

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
# Ray's log line for a GCS that refused the probe's token (gcs_client.cc), left out.
_REFUSED_PROBE = re.compile(rb"Failed to get cluster ID from GCS server: .*InvalidAuthToken")
_FIX = (
    "give this machine the cluster's token: copy the head's ~/.ray/auth_token to "
    "~/.ray/auth_token here, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file that "
    "holds it); or start the cluster without token authentication (RAY_AUTH_MODE=disabled "
    "on every 'ray start')"
)


def local_token() -> tuple[str, str] | None:
    """This machine's Ray token and where it came from, looked up as Ray does (the
    ``RAY_AUTH_TOKEN`` variable, the file ``RAY_AUTH_TOKEN_PATH`` names, ``~/.ray/auth_token``)."""
    if token := os.environ.get(TOKEN_ENV, "").strip():
        return token, TOKEN_ENV
    named = os.environ.get(TOKEN_PATH_ENV)
    for path in ([Path(named)] if named else []) + [Path.home() / ".ray" / "auth_token"]:
        try:
            token = path.read_text().strip()
        except OSError:
            continue
        if token:
            return token, str(path)
    return None


def local_settings() -> dict[str, str]:
    """Environment for a ``--ray local`` instance: token authentication with a token of the
    run's own unless the user chose a mode or a token (then theirs is used)."""
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        return {}
    settings = {MODE_ENV: "token"}
    if not (os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV)):
        settings[TOKEN_ENV] = secrets.token_hex(32)  # never written to ~/.ray
    return settings


def join_settings(ray: Any, address: str) -> dict[str, str]:
    """Environment for a driver joining the cluster whose GCS is at ``HOST:PORT``.

    ``RAY_AUTH_MODE=disabled`` where the cluster answers without a token, ``token`` where it
    wants one and accepts this machine's (the mode must match the cluster's: a driver in
    token mode also wants tokens from the workers that call it back); a
    :class:`ConfigError` naming the cause where the cluster wants a token this machine
    does not have or refuses the one it has. Nothing (Ray's own error follows) when the GCS
    does not answer, and nothing when ``RAY_AUTH_MODE`` is set already: the user chose.
    """
    if os.environ.get(MODE_ENV):
        return {}
    plain = {MODE_ENV: "disabled"}
    answer = _probe(ray, address, plain)
    if answer != "unauthenticated":
        return plain if answer == "ok" else {}
    found = local_token()
    if found is None:
        raise ConfigError(
            f"the Ray cluster at {address!r} uses token authentication (InvalidAuthToken: "
            "its head was started where a Ray token exists, e.g. ~/.ray/auth_token, which "
            f"Ray writes at any local ray.init) and this machine has no token; {_FIX}"
        )
    with_token = {MODE_ENV: "token"}
    if _probe(ray, address, with_token) == "unauthenticated":
        raise ConfigError(
            f"the Ray cluster at {address!r} uses token authentication and refuses this "
            f"machine's token (from {found[1]}; InvalidAuthToken): {_FIX}"
        )
    return with_token


def _probe(ray: Any, address: str, settings: dict[str, str]) -> str:
    """``ok``, ``unauthenticated`` or ``unreachable``: whether the GCS at ``address``
    answers a client with ``settings`` (Ray's own client: it fails at once on a token the
    cluster does not accept)."""
    with environment(ray, settings), _expected_refusal_unlogged():
        try:
            ray._raylet.GcsClient(address=address)
        except ray.exceptions.AuthenticationError:
            return "unauthenticated"
        except Exception:
            return "unreachable"
    return "ok"


@contextmanager
def _expected_refusal_unlogged() -> Iterator[None]:
    """The block's writes to standard error, less Ray's warning that the GCS refused the
    probe's token (``Failed to get cluster ID ... InvalidAuthToken``).

    That refusal is the answer the probe asks for (it then goes on with a token, or stops
    with an error that says why), but Ray's C++ client logs it as a warning straight to
    file descriptor 2, where it reads as a failure of a build that then works. So fd 2 goes
    to a temporary file for the probe (a few milliseconds: the GCS answers or refuses at
    once) and everything else written there is passed on afterwards, in order.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as captured:
            os.dup2(captured.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                captured.seek(0)
                kept = [
                    line
                    for line in captured.read().splitlines(keepends=True)
                    if not _REFUSED_PROBE.search(line)
                ]
                if kept:
                    os.write(2, b"".join(kept))
    finally:
        os.close(saved)


@contextmanager
def environment(ray: Any, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in this process's environment (and so in the processes Ray starts) for
    the block; Ray's cached configuration and token re-read on the way in and out."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    _reload(ray, bool(settings))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reload(ray, bool(settings))


def _reload(ray: Any, changed: bool) -> None:
    if changed:
        raylet = ray._raylet
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()
