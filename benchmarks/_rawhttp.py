"""A minimal HTTP/1.1 keep-alive client for load generation.

The load generator shares the machine's cores with the server under test, so it must
cost as little CPU per request as possible: httpx costs about 1 ms of CPU per request,
this client (on uvloop) well under 0.1 ms. It speaks only what the benchmark needs: one
connection, one request at a time, ``Content-Length`` or chunked bodies (what uvicorn sends for
non-streamed responses). It is not part of shardstream: the SDK uses httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

try:  # parsing a 1,000-shard page costs ~0.8 ms with orjson, ~1.5 ms with json
    import orjson

    loads = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dev dependency
    loads = json.loads


class ConnectionClosed(Exception):
    """The server closed the connection."""


class Response:
    """Status, lower-cased headers and body of one response."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class RawClient:
    """One keep-alive connection to ``host:port`` sending ``headers`` on every request."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self._host, self._port = host, port
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._fixed = f"Host: {host}:{port}\r\n{extra}".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, target: str, body: bytes | None = None) -> Response:
        """Send one request and read the whole response (reconnects if needed)."""
        if self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        head = f"{method} {target} HTTP/1.1\r\n".encode() + self._fixed
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        self._writer.write(head + b"\r\n" + (body or b""))
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            await self.close()
            raise ConnectionClosed("connection closed before the response") from exc
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            payload = await self._chunked()
        else:
            payload = await self._reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection") == "close":
            await self.close()
        return Response(status, headers, payload)

    async def _chunked(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body (a streamed response), whole."""
        assert self._reader is not None
        parts = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers are sent
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None
