"""docker-compose.yml is valid and gives the server an environment it starts with.

No Docker engine runs here. The file is validated against the Compose specification's
JSON schema (``compose_spec.json``, vendored from docker-compose 1.29, Apache-2.0), and,
where ``docker-compose`` is installed (``.ci/run`` installs Debian's package), also parsed
with ``docker-compose config``, the same parser Docker users run; a fresh machine without
it still runs every test. The server is started directly with the environment the compose
file gives it, against the local PostgreSQL.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.fixtures.postgres import create_database, drop_database, server_url

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    schema = json.loads((Path(__file__).with_name("compose_spec.json")).read_text())
    errors = sorted(jsonschema.Draft201909Validator(schema).iter_errors(raw), key=str)
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    docker_compose = shutil.which("docker-compose")
    if docker_compose is None:
        return raw  # the file is already in the long forms `config` would print
    result = subprocess.run(
        [docker_compose, "-f", str(REPO / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load(result.stdout)
    return config


def test_the_schema_check_catches_a_broken_file() -> None:
    schema = json.loads((Path(__file__).with_name("compose_spec.json")).read_text())
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    raw["services"]["server"]["depends_on"] = {"migrate": {"condition": "when_it_feels_like_it"}}
    raw["services"]["server"]["ports"] = [{"published": "not a port", "bogus": 1}]
    errors = list(jsonschema.Draft201909Validator(schema).iter_errors(raw))
    assert len(errors) >= 2


def test_services_and_startup_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"minio", "create-bucket", "postgres", "migrate", "server"}
    server = services["server"]
    assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert server["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["create-bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert "healthcheck" in server
    assert services["migrate"]["command"] == ["shardstream", "server", "migrate"]
    assert services["migrate"]["build"]["dockerfile"] == "deploy/Dockerfile"


def test_server_and_migrate_share_one_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["server"]["environment"] == services["migrate"]["environment"]
    env = services["server"]["environment"]
    assert env["SHARDSTREAM_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["SHARDSTREAM_DATABASE_URL"]
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"


def test_dockerfile_runs_as_non_root_with_healthcheck() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert "USER 10001" in dockerfile
    assert "HEALTHCHECK" in dockerfile
    assert "shardstream server migrate" in dockerfile


def test_server_image_requirements_come_from_pyproject() -> None:
    out = subprocess.run(
        ["python3", str(REPO / "deploy" / "server-requirements.py"), str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not any(req.startswith("torch") for req in out)
    assert any(req.startswith("fastapi") for req in out)
    assert any(req.startswith("sqlalchemy") for req in out)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def compose_database(compose: dict[str, Any]) -> Iterator[str]:
    """The compose file's database URL, pointed at the local PostgreSQL.

    Only the host (``postgres`` -> 127.0.0.1) and the database name (a fresh one, so a
    developer's own ``shardstream`` database is never touched) change; the role and password
    are the compose file's, created here if missing.
    """
    url = make_url(compose["services"]["server"]["environment"]["SHARDSTREAM_DATABASE_URL"])
    database = create_database("shardstream_compose")
    admin = create_engine(server_url(), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_roles WHERE rolname = :name"), {"name": url.username}
            ).scalar()
            if not exists:
                conn.execute(
                    text(f"CREATE ROLE \"{url.username}\" LOGIN PASSWORD '{url.password}'")
                )
            conn.execute(
                text(f'ALTER DATABASE "{make_url(database).database}" OWNER TO "{url.username}"')
            )
    finally:
        admin.dispose()
    local = url.set(host="127.0.0.1", database=make_url(database).database)
    yield local.render_as_string(hide_password=False)
    drop_database(database)


@pytest.mark.slow
def test_server_starts_with_the_compose_environment(
    compose: dict[str, Any], compose_database: str, tmp_path: Path
) -> None:
    services = compose["services"]
    env = {key: str(value) for key, value in services["server"]["environment"].items()}
    env["SHARDSTREAM_DATABASE_URL"] = compose_database
    port = _free_port()
    env["SHARDSTREAM_PORT"] = str(port)  # 8470 may be taken on a developer's machine
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDSTREAM_", "AWS_"))}
    bindir = Path(sys.executable).parent
    run_env = {**base, **env, "PATH": f"{bindir}{os.pathsep}{base.get('PATH', '')}"}

    # the migrate service's command, then the server's
    migrate = subprocess.run(
        services["migrate"]["command"], env=run_env, capture_output=True, text=True, check=False
    )
    assert migrate.returncode == 0, migrate.stderr
    log = (tmp_path / "server.log").open("wb")
    server = subprocess.Popen(services["server"]["command"], env=run_env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.2)
        auth = {"Authorization": f"Bearer {env['SHARDSTREAM_ADMIN_TOKEN']}"}
        created = httpx.post(f"{url}/v1/datasets", json={"name": "compose-check"}, headers=auth)
        assert created.status_code == 201, created.text
        listed = httpx.get(f"{url}/v1/datasets", headers=auth).json()
        assert [d["name"] for d in listed["items"]] == ["compose-check"]
        assert httpx.get(f"{url}/v1/datasets").status_code == 401
    finally:
        server.terminate()
        server.wait(10)
        log.close()
