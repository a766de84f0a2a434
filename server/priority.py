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
asks.

A commit that arrives while the loop is busy still waits, before it reaches this
middleware, for each turn of the loop to run every read step that is ready; with 64
connections reading, a turn was 64 reads' work. So reads also take one of
``read_slots`` (``SHARDSTREAM_READ_SLOTS``, 16 by default; 0: unbounded) until their
answer starts: the others wait here, costing nothing per turn, and a turn holds at most
that many reads' work whatever the number of connections. A slot is given back when the
answer starts (a client slow to take a streamed answer holds none).

Holding every caller's reads is a privilege, so only a commit its caller may make gets
it, checked without any database work: the caller is authenticated (it sits behind
:class:`~shardstream.server.limits.RequestGuard`, so its body has arrived too: a client
dripping a body holds nothing), has ``write`` scope, has credit left in its budget
(:data:`~shardstream.server.budget.IN_BUDGET`), and has committed to that run in this
process before (:class:`ProvenWriters`: a commit answered 200 or 201 proves the caller
owns the run, or is an admin over its datasets). A job's first commit per process is
served as an ordinary write; a read token's commits, refused (403), never hold anyone's
reads. Other writes (shard registration, publication: large, rare, not on a training
loop) take no priority, so they never hold a starting job's reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import OrderedDict

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardstream.server.auth import PRINCIPAL, Principal
from shardstream.server.budget import IN_BUDGET
from shardstream.wire import Scope as TokenScope

MAX_READ_WAIT_S = 0.5
"""The longest a read waits for writes in flight: reads get their turn even under a
continuous stream of writes (a write takes a few milliseconds when it has the loop)."""

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
PRIORITY_WRITES = re.compile(r"^/v1/runs/([^/]+)/checkpoints/?$")
"""The writes that may take priority: checkpoint commits (``POST``); group 1 is the run."""


class ProvenWriters:
    """(run, principal) pairs whose commit this process accepted, the most recent
    ``limit``: run ownership never changes, so an accepted commit proves the next one
    may be made too."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._pairs: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __contains__(self, pair: tuple[str, str]) -> bool:
        return pair in self._pairs

    def add(self, pair: tuple[str, str]) -> None:
        """Remember an accepted commit (dropping the oldest beyond ``limit``)."""
        self._pairs[pair] = None
        self._pairs.move_to_end(pair)
        while len(self._pairs) > self.limit:
            self._pairs.popitem(last=False)


class WritePriority:
    """Hold new reads while a checkpoint commit that may take priority is in the server
    (at most ``max_read_wait_s``)."""

    def __init__(
        self, app: ASGIApp, *, max_read_wait_s: float | None = None, read_slots: int = 16
    ) -> None:
        self.app = app
        self.max_read_wait_s = MAX_READ_WAIT_S if max_read_wait_s is None else max_read_wait_s
        self.writes = 0  # prioritized checkpoint commits in the server now
        self.proven = ProvenWriters()
        self._no_writes = asyncio.Event()
        self._no_writes.set()
        self._read_slots = asyncio.Semaphore(read_slots) if read_slots > 0 else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method in _READS:
            if self.writes:  # the common case, no write in flight, costs one comparison
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_writes.wait(), self.max_read_wait_s)
            await self._read(scope, receive, send)
            return
        commit = PRIORITY_WRITES.match(scope["path"]) if method == "POST" else None
        principal: Principal | None = scope.get(PRINCIPAL)
        if commit is None or principal is None or not principal.has(TokenScope.write):
            await self.app(scope, receive, send)
            return
        pair = (commit.group(1), principal.principal_id)
        if pair not in self.proven or not scope.get(IN_BUDGET, True):
            await self._unprioritized(pair, scope, receive, send)
            return
        self.writes += 1
        self._no_writes.clear()
        try:
            await self.app(scope, receive, send)
        finally:
            self.writes -= 1
            if not self.writes:
                self._no_writes.set()

    async def _unprioritized(
        self, pair: tuple[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Serve a commit as an ordinary write; remember its caller if it was accepted."""

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in (200, 201):
                self.proven.add(pair)
            await send(message)

        await self.app(scope, receive, watch)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a read in one of the read slots, held until its answer starts."""
        slots = self._read_slots
        if slots is None:
            await self.app(scope, receive, send)
            return
        await slots.acquire()
        held = True

        async def started(message: Message) -> None:
            nonlocal held
            if held and message["type"] == "http.response.start":
                held = False
                slots.release()
            await send(message)

        try:
            await self.app(scope, receive, started)
        finally:
            if held:
                slots.release()
