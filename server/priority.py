"""Writes before reads: a checkpoint commit never queues behind a crowd of reads.

A server process is one event loop plus a thread pool sharing one GIL. Start-up reads
(versions, index pages, presigned URLs) are served from memory in the event loop, so a
job of many ranks starting at once keeps the loop busy all the time. A write (a
checkpoint commit, the one request on the training loop's path) then pays twice: each of
its steps through the loop waits behind every read that is ready, and its database work,
in a pool thread, waits for the GIL the busy loop holds (about 5 ms each time it lets
go of it for I/O). Measured with 64 connections reading back to back: a commit took
1.4 s at the median and 2.4-3.2 s at p99 (``benchmarks/server_load.py``, canary commits).

:class:`WritePriority` (pure ASGI) holds the reads that arrive while a checkpoint commit
is in the server: they wait (holding no thread and no database connection) until no
commit is in flight, or at most :data:`MAX_READ_WAIT_S`, so a stream of commits cannot
starve reads. Reads already being served finish: they take a fraction of a millisecond
each. The loop is then free for the commit's steps and its thread gets the GIL when it
asks. It sits behind :class:`~shardstream.server.limits.RequestGuard`: only an
authenticated commit whose body has arrived can hold reads (a client dripping a body
holds nothing). Other writes (shard registration, publication: large, rare, not on a
training loop) take no priority, so they never hold a starting job's reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

from starlette.types import ASGIApp, Receive, Scope, Send

MAX_READ_WAIT_S = 0.5
"""The longest a read waits for writes in flight: reads get their turn even under a
continuous stream of writes (a write takes a few milliseconds when it has the loop)."""

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
PRIORITY_WRITES = re.compile(r"^/v1/runs/[^/]+/checkpoints/?$")
"""The writes that take priority: checkpoint commits (``POST``)."""


class WritePriority:
    """Hold new reads while a checkpoint commit is in the server (at most
    ``max_read_wait_s``)."""

    def __init__(self, app: ASGIApp, *, max_read_wait_s: float | None = None) -> None:
        self.app = app
        self.max_read_wait_s = MAX_READ_WAIT_S if max_read_wait_s is None else max_read_wait_s
        self.writes = 0  # checkpoint commits in the server now
        self._no_writes = asyncio.Event()
        self._no_writes.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method in _READS:
            if self.writes:  # the common case, no write in flight, costs one comparison
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_writes.wait(), self.max_read_wait_s)
            await self.app(scope, receive, send)
            return
        if method != "POST" or not PRIORITY_WRITES.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        self.writes += 1
        self._no_writes.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.writes -= 1
            if not self.writes:
                self._no_writes.set()
