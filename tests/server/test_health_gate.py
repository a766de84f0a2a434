"""``/readyz`` answers within its own deadline whatever the database does: a migration
table the test keeps locked (PostgreSQL) makes the check wait, and the probe is answered
503 naming the deadline, not left hanging until the database's lock timeout."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from shardstream.server.health_gate import READY_DEADLINE_S
from tests.fixtures.server import start_server


def test_readyz_answers_within_its_deadline_while_the_database_waits(
    postgres_url: str, tmp_path: Path
) -> None:
    with (
        start_server(tmp_path, database_url=postgres_url, db_lock_timeout_s=60) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        assert client.get("/readyz").status_code == 200
        locker = create_engine(postgres_url)
        try:
            with locker.connect() as conn:
                held = conn.begin()
                conn.execute(text("LOCK TABLE alembic_version IN ACCESS EXCLUSIVE MODE"))
                waiting = client.get("/readyz")
                assert waiting.status_code == 503
                detail = waiting.json()["detail"]
                assert f"did not answer within {READY_DEADLINE_S:g} s" in detail
                assert client.get("/healthz").json() == {"status": "ok", "detail": ""}
                held.rollback()
        finally:
            locker.dispose()
        assert client.get("/readyz").status_code == 200  # the lock gone, ready again
