"""docker-compose.yml is valid and gives the server an environment it starts with.

No Docker engine runs here, so the file is checked with Debian's ``docker-compose
config`` (the same parser Docker users run), and the server is started directly with the
environment the compose file gives it, against the local PostgreSQL.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    docker_compose = shutil.which("docker-compose")
    assert docker_compose, "docker-compose is not installed (.ci/run installs Debian's package)"
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
