"""Request limits enforced in front of parsing: the caller first, then a bounded body.

FastAPI reads and parses a body before it resolves any dependency, the token included:
left alone, an anonymous client could make the server buffer and parse any amount of
JSON, or hold a request open forever by never finishing its body. :class:`RequestGuard`
(pure ASGI, so it costs no task or thread per request) runs before all of that, for
every request that can carry a body (``POST``, ``PUT``, ``PATCH``, ``DELETE``):

1. a declared ``Content-Length`` above the route's limit is answered 413 at once;
2. the bearer token is checked (401 without reading a byte of the body), except on the
   console's sign-in form, whose small body is the token;
3. the body is read here, whatever the headers say (``Content-Length``, or a
   ``Transfer-Encoding`` in any spelling: header values are case-insensitive), counting
   bytes as they arrive and within ``SHARDSTREAM_BODY_TIMEOUT_S`` from its first byte
   requested: 413 or 408 otherwise, nothing buffered beyond the limit;
4. the application then gets the whole body at once, so nothing behind this point (a
   database session, the SQLite write gate) ever waits on a client's network.

Error answers close the connection: the unread rest of the body is not drained.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from sqlalchemy import exc as sa_exc
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardstream.errors import APIError
from shardstream.server.console.session import FORM_LIMIT
from shardstream.server.console.session import PREFIX as CONSOLE_PREFIX
from shardstream.server.db import describe_failure

log = logging.getLogger("shardstream.server")

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
SIGN_IN_PATH = CONSOLE_PREFIX + "/login"
"""The one body-carrying route without a token: its body (at most the console's form
limit, within the body timeout) is the token, checked by the route like any other."""

# Shard registration sends up to 5,000 shards with their MDS index entries per request.
_SHARD_BATCH = re.compile(r"^/v1/datasets/[^/]+/versions/[^/]+/shards/?$")


@dataclass(frozen=True)
class BodyLimits:
    """How large a request body may be and how long a client may take to send it."""

    max_bytes: int = 8 << 20
    max_shard_batch_bytes: int = 64 << 20
    timeout_s: float = 30.0

    def for_request(self, method: str, path: str) -> tuple[int, str]:
        """The byte limit for a request and the setting that sets it."""
        if method == "POST" and _SHARD_BATCH.match(path):
            return self.max_shard_batch_bytes, "SHARDSTREAM_MAX_SHARD_BATCH_BYTES"
        if path.startswith(CONSOLE_PREFIX + "/"):
            return min(self.max_bytes, FORM_LIMIT), "the console's form limit"
        return self.max_bytes, "SHARDSTREAM_MAX_BODY_BYTES"


class _RefusedError(Exception):
    """An answer the guard gives instead of the application's."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _DisconnectedError(Exception):
    """The client went away before its body was complete."""


Authenticate = Callable[[Request], Awaitable[object]]


class RequestGuard:
    """Pure ASGI middleware: size and time bounds on bodies, authentication before them.

    ``authenticate`` raises :class:`~shardstream.errors.APIError` (401) for a bad token
    and remembers the caller on the request, so the routes do not look it up again.
    """

    def __init__(self, app: ASGIApp, *, limits: BodyLimits, authenticate: Authenticate) -> None:
        self.app = app
        self.limits = limits
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope.get("method", ""))
        headers = Headers(scope=scope)
        declared = _content_length(headers)
        if method in _READS and declared is None:  # the hot path: reads carry no body
            await self.app(scope, receive, send)
            return
        limit, setting = self.limits.for_request(method, str(scope.get("path", "")))
        # Whether a body may follow, for closing the connection on a refusal. Header values
        # are case-insensitive ("Chunked", "gzip, chunked"); the body is read and bounded
        # below whatever the headers say, so this only decides what an error answer does.
        has_body = (declared or 0) > 0 or "transfer-encoding" in headers
        try:
            if declared is not None and declared > limit:
                raise _RefusedError(413, _too_large(limit, setting))
            if method in _READS:  # read routes take no body and never read one
                await self.app(scope, receive, send)
                return
            if scope.get("path") != SIGN_IN_PATH:  # the sign-in form is how a token arrives
                await self._authenticate(scope)
            # Always read here, never by what the headers promise: an application reading
            # a body the guard let through unread would buffer it without bound or deadline.
            # A request without a body costs one receive() that answers at once.
            body = await self._read_body(receive, limit, setting)
        except _RefusedError as refused:
            await _answer(send, refused.status, refused.detail, close=has_body)
            return
        except _DisconnectedError:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _authenticate(self, scope: Scope) -> None:
        try:
            await self.authenticate(Request(scope))
        except APIError as exc:
            raise _RefusedError(exc.status or 401, str(exc)) from None
        except sa_exc.SQLAlchemyError as exc:
            log.warning("database unavailable", extra={"error": str(exc)[:300]})
            raise _RefusedError(503, describe_failure(exc)) from None

    async def _read_body(self, receive: Receive, limit: int, setting: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        timeout = self.limits.timeout_s
        try:
            with anyio.fail_after(timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _DisconnectedError
                    chunk: bytes = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise _RefusedError(413, _too_large(limit, setting))
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise _RefusedError(
                408,
                f"the request body was not received within {timeout:g} s "
                f"(SHARDSTREAM_BODY_TIMEOUT_S; {size} bytes arrived)",
            ) from None


def _content_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # the HTTP server rejects such requests before they get here


def _too_large(limit: int, setting: str) -> str:
    return f"the request body is larger than {limit} bytes ({setting})"


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive channel that yields the already-read body, then the client's events."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(send: Send, status: int, detail: str, *, close: bool) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if close:  # the rest of the body stays unread: end the connection, not drain it
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
