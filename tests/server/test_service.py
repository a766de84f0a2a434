"""Service plumbing: settings safety, CLI, migrations, health, error mapping, logs."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import exc as sa_exc

from shardstream.cli import main
from shardstream.errors import ConfigError
from shardstream.server.app import create_app
from shardstream.server.config import Settings
from shardstream.server.db import make_engine
from shardstream.server.logs import JSONFormatter
from shardstream.server.migrate import current_revision, head_revision
from shardstream.server.models import Base
from tests.fixtures.server import free_port


def test_unsafe_settings_refuse_to_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SQLite supports one server process"):
        Settings(data_dir=tmp_path, workers=4).check_safe()
    with pytest.raises(ConfigError, match=r"SHARDSTREAM_HOST=0\.0\.0\.0"):
        Settings(data_dir=tmp_path, host="0.0.0.0").check_safe(has_db_tokens=False)
    Settings(data_dir=tmp_path, host="0.0.0.0").check_safe(has_db_tokens=True)
    Settings(data_dir=tmp_path, host="0.0.0.0", admin_token="x" * 20).check_safe(
        has_db_tokens=False
    )
    Settings(database_url="postgresql+psycopg://h/db", workers=4).check_safe()
    with pytest.raises(ValueError, match="at least 12"):
        Settings(admin_token="short")


def test_cli_refuses_unsafe_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SHARDSTREAM_ADMIN_TOKEN", raising=False)
    port = str(free_port())  # the server binds its port before it looks at the database
    assert main(["server", "--data-dir", str(tmp_path), "--host", "0.0.0.0", "--port", port]) == 1
    assert "no admin token exists" in capsys.readouterr().err
    assert main(["server", "--data-dir", str(tmp_path), "--workers", "3"]) == 1
    assert "SQLite supports one server process" in capsys.readouterr().err


def test_cli_migrate_and_create_token(
    db_url: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["server", "migrate", "--database-url", db_url]) == 0
    assert f"-> {head_revision()}" in capsys.readouterr().out
    assert (
        main(
            [
                "server",
                "create-token",
                "--database-url",
                db_url,
                "--name",
                "ops",
                "--scopes",
                "admin",
            ]
        )
        == 0
    )
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    with TestClient(create_app(settings.model_copy(update={"admin_token": None}))) as client:
        r = client.get("/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
        me = r.json()
        assert me.pop("principal").startswith("token:")
        assert me == {"name": "ops", "scope": "admin", "datasets": None, "expires_at": None}
    assert main(["server", "create-token", "--database-url", db_url, "--scopes", "nope"]) == 1
    assert "--scopes" in capsys.readouterr().err


def test_migrations_match_models(db_url: str) -> None:
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_fresh_database_is_migrated_on_start(tmp_path: Path, postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'new.db'}", postgres_url):
        app = create_app(Settings(database_url=url, data_dir=tmp_path, log_level="WARNING"))
        assert current_revision(app.state.engine) == head_revision()
        app.state.engine.dispose()


def test_db_errors_map_to_409_and_503(settings: Settings) -> None:
    app = create_app(settings)

    def integrity() -> None:
        raise sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))

    app.add_api_route("/boom/integrity", integrity)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom/integrity")
        assert r.status_code == 409
        assert "conflicts" in r.json()["detail"]
    app.state.engine.dispose()
    down = create_app(
        settings.model_copy(
            update={"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/none"}
        )
    )
    headers = {"Authorization": "Bearer ss_some_unknown_token"}
    with TestClient(down, raise_server_exceptions=False) as client:
        r = client.get("/v1/datasets", headers=headers)
        assert r.status_code == 503
        assert "unavailable" in r.json()["detail"]
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "unavailable"
        assert client.get("/healthz").status_code == 200


def test_json_logs() -> None:
    record = logging.LogRecord(
        "shardstream.server", logging.INFO, __file__, 1, "hello %s", ("x",), None
    )
    record.route = "/v1/runs"
    entry = json.loads(JSONFormatter().format(record))
    assert (entry["message"], entry["level"], entry["route"]) == ("hello x", "INFO", "/v1/runs")


def test_openapi_documents_errors(api: TestClient) -> None:
    spec = api.get("/openapi.json").json()
    op = spec["paths"]["/v1/datasets/{name}/versions/{number}/publish"]["post"]
    assert {"401", "403", "404", "409", "422", "503"} <= set(op["responses"])
    assert "HTTPValidationError" not in json.dumps(spec)


def test_shardstream_server_command_serves(db_url: str, settings: Settings, tmp_path: Path) -> None:
    """`shardstream server` in a real process: migrates, serves, logs JSON; 2 workers on
    PostgreSQL."""
    import os
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workers = "1" if db_url.startswith("sqlite") else "2"
    env = {
        **os.environ,
        "SHARDSTREAM_ADMIN_TOKEN": "ss_cli_admin_token_123",
        "SHARDSTREAM_LOG_LEVEL": "INFO",
    }
    cmd = [
        sys.executable,
        "-m",
        "shardstream",
        "server",
        "--database-url",
        db_url,
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path),
        "--workers",
        workers,
    ]
    log = tmp_path / "server.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            headers = {"Authorization": "Bearer ss_cli_admin_token_123"}
            assert (
                httpx.post(f"{base}/v1/datasets", json={"name": "cli"}, headers=headers).status_code
                == 201
            )
            assert httpx.get(f"{base}/v1/datasets/cli", headers=headers).json()["name"] == "cli"
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    access = [e for e in lines if e.get("logger") == "shardstream.server.access"]
    assert any(e["route"] == "/v1/datasets" and e["status"] == 201 for e in access), lines[:5]
