"""A TCP proxy on loopback that can hold, delay or drop what clients send to a server.

It stands between the client SDK and a real server, to make the server slow or briefly
unreachable without changing the server: requests wait while the gate is closed, each
chunk a client sends can be delayed, and the first connections can be cut at once (as a
restarting server does).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType


class TCPGate:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (``host, port``).

    ``gate``: clients' bytes wait while it is clear (it starts set: open). ``delay_s``:
    each chunk a client sends waits that long first. ``cut_first``: that many accepted
    connections are closed without forwarding anything.
    """

    def __init__(
        self, upstream: tuple[str, int], *, delay_s: float = 0.0, cut_first: int = 0
    ) -> None:
        self.upstream = upstream
        self.delay_s = delay_s
        self.cut_first = cut_first
        self.gate = threading.Event()
        self.gate.set()
        self.requests_seen = 0  # chunks clients sent (a request is usually one)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="tcp-gate", daemon=True).start()

    @property
    def url(self) -> str:
        """The proxy's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cut_first > 0:
                self.cut_first -= 1
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                if from_client:
                    self.gate.wait()
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    self.requests_seen += 1
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Stop accepting and cut every forwarded connection."""
        self._closed = True
        self.gate.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> TCPGate:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
