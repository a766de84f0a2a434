"""Server test fixtures: every test runs on SQLite and on PostgreSQL.

``db_url`` (session, parametrized) is a migrated database per backend; ``app`` empties
it before each test (truncation keeps tests isolated at a fraction of a fresh database's
cost) and builds a fresh app; ``api`` is a TestClient with the admin token.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.server.app import create_app
from shardstream.server.config import Settings
from shardstream.server.db import make_engine
from shardstream.server.migrate import upgrade
from tests.fixtures.postgres import truncate_all
from tests.fixtures.server import LiveServer, server_storage_roots, start_server

ADMIN = "ss_admin_test_secret_0123456789"


_CLI_ENV = [
    "SHARDSTREAM_DATABASE_URL",
    "SHARDSTREAM_DATA_DIR",
    "SHARDSTREAM_HOST",
    "SHARDSTREAM_PORT",
    "SHARDSTREAM_STORAGE_ROOT",
    "SHARDSTREAM_WORKERS",
    "SHARDSTREAM_LOG_FORMAT",
    "SHARDSTREAM_LOG_LEVEL",
    "SHARDSTREAM_MIGRATE_ON_START",
    "SHARDSTREAM_ADMIN_TOKEN",
    "SHARDSTREAM_SERVER",
    "SHARDSTREAM_TOKEN",
]


# The loggers `shardstream server` configures for its process (server/logs.py).
_CLI_LOGGERS = ["", "shardstream", "uvicorn", "uvicorn.error", "alembic"]


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start each test without SHARDSTREAM_* settings and undo what the CLI sets: its
    environment variables and its logging set-up (run in-process, ``main(["server"])``)."""
    from shardstream.server.config import get_settings

    for name in _CLI_ENV:
        monkeypatch.setenv(name, "")  # records the original value for teardown...
        monkeypatch.delenv(name)  # ...so variables the CLI sets are removed again
    loggers = [logging.getLogger(name) for name in _CLI_LOGGERS]
    saved = [(log.handlers[:], log.level, log.propagate) for log in loggers]
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
    for log, (handlers, level, propagate) in zip(loggers, saved, strict=True):
        log.handlers[:], log.level, log.propagate = handlers, level, propagate


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated database URL for each backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'server.db'}"
    else:
        url = request.getfixturevalue("postgres_session_url")
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture
def settings(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Settings for one test: the backend's database, emptied, and a local storage root."""
    engine = make_engine(db_url)
    truncate_all(engine)
    engine.dispose()
    storage = tmp_path / "storage"
    storage.mkdir()
    return Settings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        storage_root=storage.as_uri(),
        storage_roots=server_storage_roots(tmp_path, request),
        admin_token=ADMIN,
        migrate_on_start=False,
        log_level="WARNING",
    )


@pytest.fixture
def app(settings: Settings) -> Iterator[FastAPI]:
    """A fresh app on the test database."""
    application = create_app(settings)
    yield application
    application.state.engine.dispose()


@pytest.fixture
def api(app: FastAPI) -> Iterator[TestClient]:
    """A client authenticated with the bootstrap admin token."""
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        yield client


@pytest.fixture
def storage_dir(settings: Settings) -> Path:
    """The local directory behind the server's default storage root."""
    assert settings.storage_root is not None
    return Path(settings.storage_root.removeprefix("file://"))


def shard(index: int, *, size: int = 10, key: str | None = None, **extra: Any) -> dict[str, Any]:
    """A shard record (wire JSON)."""
    return {
        "index": index,
        "key": key or f"shard.{index:05d}.mds",
        "samples": 3,
        "raw_bytes": size,
        "stored_bytes": size,
        "hashes": {"sha1": f"{index:040x}"},
        **extra,
    }


def make_published(
    api: TestClient, dataset: str, root: Path, *, shards: int = 3, size: int = 10
) -> dict[str, Any]:
    """Create ``dataset`` (if needed) and publish a version whose shards exist under ``root``."""
    if api.get(f"/v1/datasets/{dataset}").status_code == 404:
        assert api.post("/v1/datasets", json={"name": dataset}).status_code == 201
    version = api.post(
        f"/v1/datasets/{dataset}/versions",
        json={"columns": {"x": "int"}, "storage_root": root.as_uri()},
    ).json()
    number = version["number"]
    for i in range(shards):
        (root / f"shard.{i:05d}.mds").parent.mkdir(parents=True, exist_ok=True)
        (root / f"shard.{i:05d}.mds").write_bytes(b"x" * size)
    body = {"shards": [shard(i, size=size) for i in range(shards)]}
    assert (
        api.post(f"/v1/datasets/{dataset}/versions/{number}/shards", json=body).status_code == 200
    )
    published = api.post(f"/v1/datasets/{dataset}/versions/{number}/publish")
    assert published.status_code == 200, published.text
    result: dict[str, Any] = published.json()
    return result


@pytest.fixture
def live(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A live server (uvicorn on loopback) on this backend's emptied test database."""
    engine = make_engine(db_url)
    truncate_all(engine)
    engine.dispose()
    with start_server(
        tmp_path / "live",
        database_url=db_url,
        migrate_on_start=False,
        storage_roots=server_storage_roots(tmp_path, request),
    ) as server:
        yield server
