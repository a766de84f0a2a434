"""Runs belong to the principal that created them: attacks by other writers and admins.

Every test runs against a live uvicorn server on SQLite and on PostgreSQL, and checks the
effect of a refused write (the owner's resume point, the run's status), not only the 403.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from shardstream.server.db import make_engine
from shardstream.server.migrate import current_revision, upgrade
from tests.fixtures.server import LiveServer
from tests.server.conftest import make_published


@pytest.fixture
def admin(live: LiveServer) -> Iterator[httpx.Client]:
    """The bootstrap admin (its own principal, ``admin``)."""
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=30) as client:
        yield client


def mint(admin: httpx.Client, name: str, scopes: list[str], datasets: list[str] | None) -> str:
    r = admin.post("/v1/tokens", json={"name": name, "scopes": scopes, "datasets": datasets})
    assert r.status_code == 201, r.text
    secret: str = r.json()["secret"]
    return secret


def as_token(live: LiveServer, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def start_run(client: httpx.Client, *datasets: str) -> dict[str, Any]:
    body = {"sources": [{"dataset": d, "version": 1} for d in datasets], "global_batch_size": 8}
    r = client.post("/v1/runs", json=body)
    assert r.status_code == 201, r.text
    run: dict[str, Any] = r.json()
    return run


def state(step: int) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "sample_in_epoch": step * 8, "plan": {"p": 4}}


def test_another_writer_cannot_hijack_a_run(
    live: LiveServer, admin: httpx.Client, tmp_path: Path
) -> None:
    make_published(admin, "alpha", tmp_path / "alpha")
    owner = as_token(live, mint(admin, "trainer", ["write"], ["alpha"]))
    attacker = as_token(live, mint(admin, "other-team", ["write"], ["alpha"]))
    run = start_run(owner, "alpha")
    me = owner.get("/v1/whoami").json()
    assert (me["name"], me["principal"]) == ("trainer", run["owner"])
    assert run["owner"].startswith("token:") and run["created_by"] == "trainer"
    assert attacker.get("/v1/whoami").json()["principal"] != run["owner"]
    url = f"/v1/runs/{run['id']}"
    assert owner.post(f"{url}/checkpoints", json=state(10)).status_code == 201

    # The attack from the review: commit a far step so resume="latest" uses it (10**11:
    # within the bound on steps, which refuses 10**15 with a 422 before ownership counts).
    hijack = attacker.post(f"{url}/checkpoints", json=state(10**11))
    assert hijack.status_code == 403
    assert f"run {run['id']} belongs to {run['owner']}" in hijack.json()["detail"]
    # A replay of the owner's own step is refused as well (no probing of stored states).
    assert attacker.post(f"{url}/checkpoints", json=state(10)).status_code == 403
    assert attacker.patch(url, json={"status": "completed"}).status_code == 403

    # Effect: the owner resumes from its own state and keeps committing; still running.
    latest = owner.get(f"{url}/checkpoints/latest").json()
    assert (latest["step"], latest["sample_in_epoch"]) == (10, 80)
    assert owner.post(f"{url}/checkpoints", json=state(20)).status_code == 201
    assert [c["step"] for c in owner.get(f"{url}/checkpoints").json()["items"]] == [10, 20]
    assert owner.get(url).json()["status"] == "running"
    # Reading stays open to every token that may read the run's datasets.
    assert attacker.get(url).status_code == 200
    assert attacker.get(f"{url}/checkpoints/latest").json()["step"] == 20
    assert owner.patch(url, json={"status": "completed"}).json()["status"] == "completed"


def test_admins_write_runs_only_over_all_their_datasets(
    live: LiveServer, admin: httpx.Client, tmp_path: Path
) -> None:
    make_published(admin, "alpha", tmp_path / "alpha")
    make_published(admin, "beta", tmp_path / "beta")
    owner = as_token(live, mint(admin, "trainer", ["write"], None))
    alpha_admin = as_token(live, mint(admin, "alpha-admin", ["admin"], ["alpha"]))
    both_admin = as_token(live, mint(admin, "ab-admin", ["admin"], ["alpha", "beta"]))
    mixed = start_run(owner, "alpha", "beta")
    url = f"/v1/runs/{mixed['id']}"
    assert owner.post(f"{url}/checkpoints", json=state(5)).status_code == 201

    # An admin over alpha only cannot even read a run that reads beta, nor change it.
    assert alpha_admin.get(url).status_code == 403
    assert alpha_admin.post(f"{url}/checkpoints", json=state(99)).status_code == 403
    assert alpha_admin.patch(url, json={"status": "failed"}).status_code == 403
    assert owner.get(url).json()["status"] == "running"
    assert owner.get(f"{url}/checkpoints/latest").json()["step"] == 5

    # An admin over both may (e.g. to stop a runaway job), as may the bootstrap admin.
    assert both_admin.post(f"{url}/checkpoints", json=state(6)).status_code == 201
    assert both_admin.patch(url, json={"status": "failed"}).json()["status"] == "failed"
    assert admin.patch(url, json={"status": "cancelled"}).json()["status"] == "cancelled"

    # A run the bootstrap admin created belongs to the "admin" principal: a writer with
    # access to all datasets still cannot touch it.
    admins_run = start_run(admin, "alpha")
    assert admins_run["owner"] == "admin"
    refused = owner.post(f"/v1/runs/{admins_run['id']}/checkpoints", json=state(1))
    assert refused.status_code == 403
    assert admin.get(f"/v1/runs/{admins_run['id']}/checkpoints").json()["items"] == []


def test_the_owner_is_never_chosen_by_the_caller(
    live: LiveServer, admin: httpx.Client, tmp_path: Path
) -> None:
    make_published(admin, "alpha", tmp_path / "alpha")
    writer = as_token(live, mint(admin, "writer", ["write"], None))
    victim = start_run(writer, "alpha")
    body = {
        "sources": [{"dataset": "alpha", "version": 1}],
        "global_batch_size": 8,
        "owner": victim["owner"],
    }
    claimed = writer.post("/v1/runs", json=body)
    assert claimed.status_code == 422
    assert claimed.json()["detail"].startswith("body.owner")
    named = writer.post("/v1/datasets", json={"name": "gamma", "owner": "someone-else"})
    assert named.status_code == 422
    assert named.json()["detail"].startswith("body.owner")
    assert writer.post("/v1/datasets", json={"name": "gamma"}).status_code == 201
    assert admin.get("/v1/datasets/gamma").json()["owner"] == "writer"
    assert [r["id"] for r in admin.get("/v1/runs").json()["items"]] == [victim["id"]]


def test_a_run_from_before_owners_is_written_by_admins_only(
    live: LiveServer, admin: httpx.Client, tmp_path: Path
) -> None:
    make_published(admin, "alpha", tmp_path / "alpha")
    creator = as_token(live, mint(admin, "old-trainer", ["write"], None))
    run = start_run(creator, "alpha")
    engine = make_engine(live.database_url)
    with engine.begin() as conn:  # what migration 0004 leaves on existing rows
        conn.execute(text("UPDATE runs SET owner = NULL WHERE id = :id"), {"id": run["id"]})
    engine.dispose()
    url = f"/v1/runs/{run['id']}"
    assert creator.get(url).json()["owner"] is None
    refused = creator.post(f"{url}/checkpoints", json=state(1))
    assert refused.status_code == 403
    assert "before runs had owners" in refused.json()["detail"]
    assert admin.post(f"{url}/checkpoints", json=state(1)).status_code == 201
    assert admin.patch(url, json={"status": "completed"}).json()["status"] == "completed"


def _runs_at_0003(url: str) -> None:
    engine = make_engine(url)
    upgrade(engine, "0003_storage_locations")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO runs (id, name, seed, global_batch_size, plan, status, created_by, "
                "created_at, updated_at, latest_step) VALUES (7, 'old', 1, 8, '{}', 'running', "
                "'trainer', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, 3)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO checkpoints (run_id, step, epoch, sample_in_epoch, plan, "
                "created_at) VALUES (7, 3, 0, 24, '{}', CURRENT_TIMESTAMP)"
            )
        )
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0004_keeps_runs_and_leaves_them_ownerless(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    _runs_at_0003(url)
    engine = make_engine(url)
    upgrade(engine, "0004_run_owner")
    assert current_revision(engine) == "0004_run_owner"
    with closing(engine.connect()) as conn:
        assert conn.execute(text("SELECT id, owner, latest_step FROM runs")).all() == [(7, None, 3)]
        # No table was copied: the checkpoint that points at the run is still there.
        assert conn.execute(text("SELECT count(*) FROM checkpoints")).scalar() == 1
    engine.dispose()


def test_only_admins_force_delete_a_dataset_that_others_runs_read(
    live: LiveServer, admin: httpx.Client, tmp_path: Path
) -> None:
    make_published(admin, "alpha", tmp_path / "alpha")
    make_published(admin, "spare", tmp_path / "spare")
    owner = as_token(live, mint(admin, "trainer", ["write"], ["alpha"]))
    other = as_token(live, mint(admin, "other-team", ["write"], None))
    run = start_run(owner, "alpha")
    assert owner.post(f"/v1/runs/{run['id']}/checkpoints", json=state(1)).status_code == 201
    forced = other.delete("/v1/datasets/alpha", params={"force": "true"})
    assert forced.status_code == 403
    assert "admin" in forced.json()["detail"] and f"run(s) {run['id']}" in forced.json()["detail"]
    # Effect: the dataset and the owner's job are untouched.
    assert admin.get("/v1/datasets/alpha").json()["latest_published"] == 1
    assert owner.post(f"/v1/runs/{run['id']}/checkpoints", json=state(2)).status_code == 201
    # A writer's force is harmless where no running run reads the dataset; admins may force.
    assert other.delete("/v1/datasets/spare", params={"force": "true"}).status_code == 204
    assert admin.delete("/v1/datasets/alpha", params={"force": "true"}).status_code == 204
    assert admin.get("/v1/datasets/alpha").status_code == 404
