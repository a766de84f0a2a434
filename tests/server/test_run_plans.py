"""Run plans with absurd numbers: refused when sent, harmless when already stored.

A plan whose mixture repeat was ``1e308`` (finite, so JSON and the NaN/inf check let it
through) made every console runs page a 500 for every viewer: the epoch size overflowed
to infinity and ``int()`` of it raised. Plans (a run's and a checkpoint's) now refuse
numbers beyond ±2**64 with a 422 naming the spot, and the console shows a run whose
stored plan holds such values (written before the check) without an epoch size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from shardstream.server.models import CheckpointRow, RunRow
from tests.server.conftest import ADMIN, make_published

ABSURD = [1e308, -1e300, 2.0**64 * 2, 2**65, -(2**70)]


def _create(api: TestClient, tmp_path: Path, plan: dict[str, Any]) -> Any:
    if api.get("/v1/datasets/corpus").status_code == 404:
        make_published(api, "corpus", tmp_path / "corpus", shards=3)
    body = {"sources": [{"dataset": "corpus", "version": 1}], "global_batch_size": 3}
    return api.post("/v1/runs", json={**body, "plan": plan})


@pytest.mark.parametrize("value", ABSURD)
def test_a_plan_with_an_absurd_number_is_refused_naming_it(
    api: TestClient, tmp_path: Path, value: float
) -> None:
    refused = _create(api, tmp_path, {"mixture": [[1.0, value, None]]})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "body.plan" in detail and "plan.mixture[0][1]" in detail
    assert "2**64" in detail
    run = _create(api, tmp_path, {"mixture": [[1.0, 2.0, None]], "seed": 2**64 - 1})
    assert run.status_code == 201, run.text  # uint64 seeds and ordinary numbers still fit
    checkpoint = {"step": 1, "epoch": 0, "sample_in_epoch": 3, "plan": {"epoch_size": value}}
    answer = api.post(f"/v1/runs/{run.json()['id']}/checkpoints", json=checkpoint)
    assert answer.status_code == 422, answer.text
    assert "plan.epoch_size" in answer.json()["detail"]


@pytest.mark.parametrize(
    "plan",
    [
        {"mixture": [[1.0, 1e308, None]]},
        {"mixture": [[1.0, -1e308, None]]},
        {"plan": {"mixture": [[1.0, 1e308, 5]], "epoch_size": -4}},
        {"epoch_size": 10**400},
        {"mixture": [[1.0, True, 2**80]]},
    ],
)
def test_runs_pages_survive_a_stored_plan_with_absurd_numbers(
    api: TestClient, app: FastAPI, tmp_path: Path, plan: dict[str, Any]
) -> None:
    """Rows written before plans were checked (or by another tool): every viewer's runs
    pages still answer, and the run can still be finished (hidden from 'running')."""
    run = _create(api, tmp_path, {})
    run_id = run.json()["id"]
    checkpoint = {"step": 1, "epoch": 2, "sample_in_epoch": 3}
    assert api.post(f"/v1/runs/{run_id}/checkpoints", json=checkpoint).status_code == 201
    with app.state.sessionmaker.begin() as session:
        session.execute(update(RunRow).where(RunRow.id == run_id).values(plan=plan))
        session.execute(
            update(CheckpointRow).where(CheckpointRow.run_id == run_id).values(plan=plan)
        )
    console = TestClient(app, follow_redirects=False)
    signed_in = console.post("/ui/login", data={"token": ADMIN, "next": "/ui/runs"})
    assert signed_in.status_code == 303, signed_in.text
    for page in ("/ui/runs", f"/ui/runs/{run_id}", "/ui/runs?status=running"):
        shown = console.get(page)
        assert shown.status_code == 200, (page, shown.text[:500])
    assert api.get(f"/v1/runs/{run_id}").status_code == 200
    done = api.patch(f"/v1/runs/{run_id}", json={"status": "cancelled"})
    assert done.status_code == 200, done.text
