"""Checkpoint commits before reads: reads that arrive while a commit is in the server wait
for it (at most ``MAX_READ_WAIT_S``), so a commit never queues behind a crowd of reads.

A real server on PostgreSQL; the test holds the run's row lock, so a commit stays in the
server, waiting for it, for as long as the test likes (PostgreSQL shows the wait in
``pg_stat_activity``: no sleeping and guessing).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from starlette.types import Message, Receive, Scope, Send

from shardstream.server import priority
from shardstream.server.auth import PRINCIPAL, Principal
from shardstream.server.budget import IN_BUDGET
from shardstream.wire import Scope as TokenScope
from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published

HANG_S = 60


def _run(server: LiveServer) -> int:
    with httpx.Client(base_url=server.url, headers=server.headers) as api:
        make_published(api, "wiki", server.storage_root / "wiki")  # type: ignore[arg-type]
        body = {"sources": [{"dataset": "wiki", "version": 1}], "global_batch_size": 4}
        run: int = api.post("/v1/runs", json=body).json()["id"]
        # The job's first commit: accepted, it proves this caller may commit to the run,
        # so its next commits take priority.
        first = {"step": 0, "epoch": 0, "sample_in_epoch": 0, "plan": {}}
        assert api.post(f"/v1/runs/{run}/checkpoints", json=first).status_code == 201
        return run


class _Timed(threading.Thread):
    """A request in a thread, with the moment its answer arrived."""

    def __init__(self, server: LiveServer, method: str, path: str, **kw: object) -> None:
        super().__init__(daemon=True)
        self.server, self.method, self.path, self.kw = server, method, path, kw
        self.status = 0
        self.answered = 0.0

    def run(self) -> None:
        with httpx.Client(base_url=self.server.url, headers=self.server.headers) as client:
            response = client.request(self.method, self.path, timeout=HANG_S, **self.kw)  # type: ignore[arg-type]
        self.status, self.answered = response.status_code, time.monotonic()


def _commit_waiting_on_the_lock(postgres_url: str) -> bool:
    engine = create_engine(postgres_url)
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                waiting = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query ILIKE '%FOR UPDATE%'"
                    )
                ).scalar()
            if waiting:
                return True
            time.sleep(0.02)
        return False
    finally:
        engine.dispose()


@pytest.mark.parametrize("max_wait", [HANG_S, 0.2])
def test_reads_wait_while_a_commit_is_in_the_server(
    monkeypatch: pytest.MonkeyPatch, postgres_url: str, tmp_path: Path, max_wait: float
) -> None:
    monkeypatch.setattr(priority, "MAX_READ_WAIT_S", max_wait)
    with start_server(tmp_path / "live", database_url=postgres_url) as server:
        run = _run(server)
        locker = create_engine(postgres_url)
        with locker.connect() as conn:
            transaction = conn.begin()
            conn.execute(text("SELECT id FROM runs WHERE id = :id FOR UPDATE"), {"id": run})
            body = {"step": 1, "epoch": 0, "sample_in_epoch": 4, "plan": {}}
            commit = _Timed(server, "POST", f"/v1/runs/{run}/checkpoints", json=body)
            commit.start()
            assert _commit_waiting_on_the_lock(postgres_url)
            read = _Timed(server, "GET", "/v1/datasets/wiki/versions/1")
            read.start()
            read.join(0.5 if max_wait == HANG_S else HANG_S)
            if max_wait == HANG_S:
                assert read.is_alive(), "a read was served while a commit was in the server"
                # Probes wait in no queue: answered while the commit still holds reads.
                for path in ("/healthz", "/readyz"):
                    probe = _Timed(server, "GET", path)
                    probe.start()
                    probe.join(HANG_S)
                    assert probe.status == 200 and read.is_alive() and commit.is_alive()
            else:  # a commit cannot hold reads for longer than MAX_READ_WAIT_S
                assert read.status == 200 and commit.is_alive()
            transaction.rollback()
        locker.dispose()
        commit.join(HANG_S)
        read.join(HANG_S)
        assert (commit.status, read.status) == (201, 200)
        if max_wait == HANG_S:
            assert commit.answered <= read.answered


# -- who may take priority: the middleware itself, driven as ASGI with the caller in scope


def _scope(
    method: str, path: str, principal: Principal | None, in_budget: bool = True
) -> dict[str, object]:
    scope: dict[str, object] = {
        "type": "http",
        "method": method,
        "path": path,
        IN_BUDGET: in_budget,
    }
    if principal is not None:
        scope[PRINCIPAL] = principal
    return scope


class _App:
    """The application behind the middleware: commits wait until ``release``; every
    request answers ``status`` for its path."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.reads_served = 0
        self.status = 201

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "POST":
            await self.release.wait()
        else:
            self.reads_served += 1
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Message) -> None:
    pass


WRITER = Principal(name="job", scope=TokenScope.write, token_id=7)
READER = Principal(name="viewer", scope=TokenScope.read, token_id=8)


async def _commit_then_read(
    guard: priority.WritePriority, app: _App, commit: dict[str, object]
) -> tuple[int, int]:
    """Send ``commit`` (held in the app), then a read; the prioritized commits in flight
    and the reads served, seen once the read has been served or has started waiting."""
    app.release.clear()
    committing = asyncio.ensure_future(guard(commit, _receive, _send))
    await asyncio.sleep(0)  # the commit is in the app now, waiting for release
    reading = asyncio.ensure_future(guard(_scope("GET", "/v1/datasets", WRITER), _receive, _send))
    for _ in range(10):
        await asyncio.sleep(0)
    seen = (guard.writes, app.reads_served)
    app.release.set()
    await asyncio.gather(committing, reading)
    return seen


def test_only_a_proven_writer_within_its_budget_holds_reads() -> None:
    async def scenario() -> None:
        app = _App()
        guard = priority.WritePriority(app, max_read_wait_s=HANG_S)
        commit = "/v1/runs/5/checkpoints"
        # A read token's commit (refused 403 by the route): it never holds reads.
        app.status = 403
        assert await _commit_then_read(guard, app, _scope("POST", commit, READER)) == (0, 1)
        assert await _commit_then_read(guard, app, _scope("POST", commit, None)) == (0, 2)
        # A writer's commit to a run it has not been seen to own: refused, no priority...
        assert await _commit_then_read(guard, app, _scope("POST", commit, WRITER)) == (0, 3)
        # ...accepted once (201): from then on its commits to that run go first.
        app.status = 201
        assert await _commit_then_read(guard, app, _scope("POST", commit, WRITER)) == (0, 4)
        assert await _commit_then_read(guard, app, _scope("POST", commit, WRITER)) == (1, 4)
        # Not to another run, and not while the writer is out of budget.
        other_run = _scope("POST", "/v1/runs/6/checkpoints", WRITER)
        assert await _commit_then_read(guard, app, other_run) == (0, 6)
        broke = _scope("POST", commit, WRITER, in_budget=False)
        assert await _commit_then_read(guard, app, broke) == (0, 7)

    asyncio.run(scenario())


def test_reads_beyond_the_read_slots_wait_until_an_answer_starts() -> None:
    """Two read slots, three reads the application holds: the third reaches the
    application only once one of the first two has started its answer (a busy loop's turn
    then holds at most two reads' work, and a commit's steps wait behind no more)."""

    async def scenario() -> None:
        reached: list[int] = []
        answer = [asyncio.Event() for _ in range(3)]

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            n = int(scope["path"].rsplit("/", 1)[1])
            reached.append(n)
            await answer[n].wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        guard = priority.WritePriority(app, read_slots=2)
        reads = [
            asyncio.ensure_future(guard(_scope("GET", f"/r/{n}", WRITER), _receive, _send))
            for n in range(3)
        ]
        for _ in range(10):
            await asyncio.sleep(0)
        assert reached == [0, 1]
        answer[1].set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert reached == [0, 1, 2]
        answer[0].set()
        answer[2].set()
        await asyncio.gather(*reads)

    asyncio.run(scenario())
