"""The database failing under a running server: a 503 naming the problem, never a 500.

SQLite: the file deleted, replaced by something that cannot be opened, by garbage or by an
empty database while the server runs. PostgreSQL: the server terminating the pool's
connections between requests (the pool replaces them) and in the middle of a transaction
(a 503, nothing half-written), and a database server that does not answer.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url

from shardstream.server.app import create_app
from shardstream.server.config import Settings
from tests.server.conftest import ADMIN, make_published

HEADERS = {"Authorization": f"Bearer {ADMIN}"}


def _settings(tmp_path: Path, database_url: str) -> Settings:
    storage = tmp_path / "storage"
    storage.mkdir(exist_ok=True)
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        storage_root=storage.as_uri(),
        storage_roots=tmp_path.as_uri(),  # make_published registers under tmp_path
        admin_token=ADMIN,
        migrate_on_start=True,
        log_level="CRITICAL",
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    """A client of a server on its own SQLite file (deleted by the tests), and that file."""
    path = tmp_path / "db" / "server.db"
    app = create_app(_settings(tmp_path, f"sqlite:///{path}"))
    with TestClient(app, headers=HEADERS, raise_server_exceptions=False) as client:
        yield client, path
    app.state.engine.dispose()


def _seed(client: TestClient, root: Path) -> int:
    """A published version, a run on it with a checkpoint; the run's id."""
    make_published(client, "wiki", root / "wiki")
    run = client.post(
        "/v1/runs", json={"sources": [{"dataset": "wiki", "version": 1}], "global_batch_size": 8}
    )
    assert run.status_code == 201, run.text
    run_id: int = run.json()["id"]
    checkpoint = {"step": 1, "epoch": 0, "sample_in_epoch": 8}
    assert client.post(f"/v1/runs/{run_id}/checkpoints", json=checkpoint).status_code == 201
    return run_id


def _database_requests(client: TestClient, run_id: int) -> dict[str, Response]:
    """Reads and writes that all need the database, by ``METHOD path``."""
    requests: list[tuple[str, str, object]] = [
        ("GET", "/v1/datasets", None),
        ("POST", "/v1/datasets", {"name": "new"}),
        ("GET", "/v1/datasets/wiki", None),
        ("POST", "/v1/datasets/wiki/versions", {"columns": {"x": "int"}}),
        ("GET", "/v1/datasets/wiki/versions", None),
        ("GET", "/v1/datasets/wiki/versions/latest", None),
        ("POST", f"/v1/runs/{run_id}/checkpoints", {"step": 2, "epoch": 0, "sample_in_epoch": 16}),
        ("GET", f"/v1/runs/{run_id}/checkpoints/latest", None),
        ("POST", "/v1/tokens", {"name": "ci", "scopes": ["read"]}),
        ("GET", "/readyz", None),
    ]
    return {f"{m} {p}": client.request(m, p, json=body) for m, p, body in requests}


def _assert_unavailable(answers: dict[str, Response], *words: str) -> None:
    for what, r in answers.items():
        assert r.status_code == 503, (what, r.status_code, r.text)
        detail = r.json()["detail"]
        assert all(w in detail for w in words), (what, detail)


def test_sqlite_file_deleted_under_the_server(
    started: tuple[TestClient, Path], tmp_path: Path
) -> None:
    client, path = started
    run_id = _seed(client, tmp_path / "shards")
    backup = tmp_path / "backup.db"
    with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(backup)) as copy:
        source.backup(copy)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)

    answers = _database_requests(client, run_id)
    # Pooled connections still had the deleted file open: not one write may be
    # acknowledged into it (it would vanish at the next restart).
    _assert_unavailable(answers, "SQLite database file", "deleted")
    assert answers["GET /readyz"].json()["status"] == "unavailable"
    assert not path.exists(), "a running server must not create an empty database in its place"
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200

    backup.rename(path)  # restored: the server recovers without a restart
    assert client.get("/readyz").json() == {"status": "ok", "detail": ""}
    assert [d["name"] for d in client.get("/v1/datasets").json()["items"]] == ["wiki"]
    latest = client.get(f"/v1/runs/{run_id}/checkpoints/latest")
    assert latest.json()["step"] == 1
    assert client.post("/v1/datasets", json={"name": "new"}).status_code == 201


def test_sqlite_file_deleted_during_a_write(
    started: tuple[TestClient, Path], tmp_path: Path
) -> None:
    client, path = started
    backup = tmp_path / "backup.db"

    def delete_after_insert(_conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith("INSERT INTO datasets"):
            return
        with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(backup)) as copy:
            source.backup(copy)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    engine = client.app.state.engine  # type: ignore[attr-defined]
    event.listen(engine, "after_cursor_execute", delete_after_insert)
    lost = client.post("/v1/datasets", json={"name": "lost"})
    event.remove(engine, "after_cursor_execute", delete_after_insert)
    assert lost.status_code == 503, lost.text
    assert "deleted" in lost.json()["detail"]
    backup.rename(path)
    assert client.get("/v1/datasets/lost").status_code == 404  # the restored file serves on
    assert client.post("/v1/datasets", json={"name": "lost"}).status_code == 201


def _replace(path: Path, how: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    if how == "unopenable":  # something SQLite cannot open (as unreadable files are)
        path.mkdir()
    elif how == "garbage":
        path.write_bytes(os.urandom(8192))
    else:
        with closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE unrelated (x)")


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("unopenable", ("SQLite database file", "cannot be opened")),
        ("garbage", ("SQLite database file", "damaged or not a database")),
        ("empty", ("lacks tables", "shardstream server migrate")),
    ],
)
def test_sqlite_file_replaced_under_the_server(
    started: tuple[TestClient, Path], tmp_path: Path, how: str, words: tuple[str, ...]
) -> None:
    client, path = started
    run_id = _seed(client, tmp_path / "shards")
    _replace(path, how)
    answers = _database_requests(client, run_id)
    _assert_unavailable(answers, *words)
    assert answers["GET /readyz"].json()["status"] == "unavailable"


def test_readyz_names_a_database_behind_this_servers_schema(tmp_path: Path) -> None:
    path = tmp_path / "server.db"
    app = create_app(_settings(tmp_path, f"sqlite:///{path}"))
    _execute(path, "UPDATE alembic_version SET version_num = '0001'")
    with TestClient(app) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "revision 0001" in ready.json()["detail"]
        assert "shardstream server migrate" in ready.json()["detail"]
        # A revision this server does not know is a newer release's: still usable.
        _execute(path, "UPDATE alembic_version SET version_num = 'f00dcafe'")
        assert client.get("/readyz").status_code == 200
    app.state.engine.dispose()


def _execute(path: Path, sql: str) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(sql)


@pytest.fixture
def postgres_app(tmp_path: Path, postgres_url: str) -> Iterator[FastAPI]:
    app = create_app(_settings(tmp_path, postgres_url))
    yield app
    app.state.engine.dispose()


def _terminate(postgres_url: str, *pids: int) -> int:
    """Terminate these backends (all others of the database if none), waiting for each."""
    url = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url, autocommit=True) as conn:
        if pids:
            query = "SELECT pg_terminate_backend(pid, 5000) FROM unnest(%s::int[]) AS pid"
            rows = conn.execute(query, (list(pids),)).fetchall()
        else:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
    return sum(1 for (done,) in rows if done)


def test_postgres_connections_terminated_between_requests(
    postgres_app: FastAPI, postgres_url: str, tmp_path: Path
) -> None:
    with TestClient(postgres_app, headers=HEADERS, raise_server_exceptions=False) as client:
        run_id = _seed(client, tmp_path / "shards")
        assert _terminate(postgres_url) >= 1  # the pool's idle connections
        answers = _database_requests(client, run_id)
        for what, r in answers.items():  # the pool noticed and reconnected: all succeed
            assert r.status_code in (200, 201), (what, r.status_code, r.text)


def test_postgres_connection_lost_mid_transaction(postgres_app: FastAPI, postgres_url: str) -> None:
    def terminate_before_commit(conn: Connection) -> None:
        _terminate(postgres_url, conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]

    with TestClient(postgres_app, headers=HEADERS, raise_server_exceptions=False) as client:
        assert client.post("/v1/datasets", json={"name": "kept"}).status_code == 201
        event.listen(postgres_app.state.engine, "commit", terminate_before_commit, once=True)
        lost = client.post("/v1/datasets", json={"name": "lost"})
        assert lost.status_code == 503, lost.text
        assert "connection to the database server was lost" in lost.json()["detail"]
        # Nothing half-written, and the next requests get a fresh connection.
        assert client.get("/v1/datasets/lost").status_code == 404
        assert client.post("/v1/datasets", json={"name": "lost"}).status_code == 201
        assert client.get("/readyz").status_code == 200


def test_postgres_unreachable(tmp_path: Path) -> None:
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    settings = _settings(tmp_path, url).model_copy(update={"migrate_on_start": False})
    app = create_app(settings)
    with TestClient(app, headers=HEADERS, raise_server_exceptions=False) as client:
        answers = _database_requests(client, run_id=1)
        _assert_unavailable(answers, "cannot connect to the database server")
    app.state.engine.dispose()
