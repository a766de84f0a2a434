"""Checkpoint commits before reads: reads that arrive while a commit is in the server wait
for it (at most ``MAX_READ_WAIT_S``), so a commit never queues behind a crowd of reads.

A real server on PostgreSQL; the test holds the run's row lock, so a commit stays in the
server, waiting for it, for as long as the test likes (PostgreSQL shows the wait in
``pg_stat_activity``: no sleeping and guessing).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from shardstream.server import priority
from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published

HANG_S = 60


def _run(server: LiveServer) -> int:
    with httpx.Client(base_url=server.url, headers=server.headers) as api:
        make_published(api, "wiki", server.storage_root / "wiki")  # type: ignore[arg-type]
        body = {"sources": [{"dataset": "wiki", "version": 1}], "global_batch_size": 4}
        run: int = api.post("/v1/runs", json=body).json()["id"]
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
            else:  # a commit cannot hold reads for longer than MAX_READ_WAIT_S
                assert read.status == 200 and commit.is_alive()
            transaction.rollback()
        locker.dispose()
        commit.join(HANG_S)
        read.join(HANG_S)
        assert (commit.status, read.status) == (201, 200)
        if max_wait == HANG_S:
            assert commit.answered <= read.answered
