"""Bounds on what a run's commits and attempts may carry, and on what its lists answer
(issues 35 and 36), on SQLite and PostgreSQL.

A write token could send a mixture schedule of 64 linear phases x 10^6 steps, a linear
phase of 2**40 steps or a position at epoch 2**40 (the audit and the console then ran for
minutes), a scheduled plan at epoch 2**62 (SQLite answered 500), 4 MiB of free-form
``changes`` per attempt, and checkpoints naming datasets outside its token (the audit then
told it their epoch sizes). A read token got the run's 10,000 attempts in one answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.api_client import APIClient
from shardstream.cli import main
from shardstream.errors import RequestValidationError
from shardstream.server.data.mixture_history import MixturePlan
from shardstream.server.models import RunAttemptRow, utcnow
from shardstream.wire import (
    MAX_ATTEMPT_CHANGES,
    MAX_ATTEMPT_CHANGES_BYTES,
    MAX_EPOCHS,
    MAX_SCHEDULE_PIECES,
    MAX_STEPS,
    check_plan_bounds,
)
from tests.fixtures.ledger_runs import GBS, PLAN
from tests.fixtures.server import LiveServer
from tests.server.conftest import ADMIN, make_published

PER_EPOCH = 6  # batches of 2 in 12 samples (4 shards of 3)


def _params(schedule: Any = None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {**PLAN, **extra}  # the ledger tests' plan
    if schedule is not None:
        params["schedule"] = schedule
    return params


def _state(epoch: int, batch: int, params: dict[str, Any], versions: Any = ("a@1",)) -> Any:
    return {
        "format": 2,
        "algorithm": 1,
        "epoch": epoch,
        "batch": batch,
        "samples": batch * GBS,
        "plan": params,
        "versions": list(versions),
        "weights": [None],
        "fingerprint": "01" + "ab" * 15,
        "worker": None,
        "world_size": 1,
        "session": "s",
    }


def _run(api: TestClient, tmp_path: Path, plan: dict[str, Any] | None = None) -> Any:
    if api.get("/v1/datasets/a").status_code == 404:
        make_published(api, "a", tmp_path / "a", shards=4)
    body = {"sources": [{"dataset": "a", "version": 1}], "global_batch_size": GBS}
    return api.post("/v1/runs", json={**body, "plan": plan or {}})


def _run_id(api: TestClient, tmp_path: Path) -> int:
    r = _run(api, tmp_path)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _commit(
    api: TestClient, run: int, step: int, epoch: int, params: dict[str, Any], **kw: Any
) -> Any:
    body = {
        "step": step,
        "epoch": epoch,
        "sample_in_epoch": 0,
        "plan": _state(epoch, 0, params, **kw),
    }
    return api.post(f"/v1/runs/{run}/checkpoints", json=body)


def _linear(phases: int, steps: int, span: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"weights": [1.0], "end_weights": [2.0], "steps": steps, "until": (i + 1) * span}
        for i in range(phases)
    ]
    return [*out, {"weights": [1.0]}]


SCHEDULES = {
    "64 linear phases x 10**6 steps": (_linear(64, 10**6, 10**7), "steps"),
    "a linear phase of 2**40 steps": (_linear(1, 16, 2**40), "until"),
    "a phase ending at 2**60 tokens": (
        {
            "tokens_per_step": 4096,
            "phases": [{"weights": [1.0], "until_tokens": 2**60}, {"weights": [1.0]}],
        },
        "until_tokens",
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_schedule_beyond_the_bounds_is_refused_naming_the_field_and_bound(
    api: TestClient, tmp_path: Path, name: str
) -> None:
    schedule, field = SCHEDULES[name]
    created = _run(api, tmp_path, _params(schedule))
    assert created.status_code == 422, created.text
    detail = created.json()["detail"]
    assert "schedule" in detail and field in detail and "at most" in detail, detail
    run = _run_id(api, tmp_path)
    refused = _commit(api, run, 1, 0, _params(schedule))
    assert refused.status_code == 422, refused.text
    assert "plan.plan.schedule" in refused.json()["detail"], refused.text
    assert api.get(f"/v1/runs/{run}/checkpoints").json()["items"] == []
    # an ordinary schedule is untouched: a ramp of 16 pieces over 10**8 steps
    assert _commit(api, run, 1, 0, _params(_linear(2, 16, 10**8))).status_code == 201


def test_every_schedule_within_the_bound_is_one_the_server_counts() -> None:
    """The bound on pieces is the mixture figures' own: a schedule at the bound is counted,
    one piece more is refused (not accepted and then left uncounted)."""
    for ramp, fits in ((MAX_SCHEDULE_PIECES - 2, True), (MAX_SCHEDULE_PIECES - 1, False)):
        schedule = _linear(1, ramp, 10**6)
        plan = {"plan": _params(schedule)}
        if fits:
            check_plan_bounds(plan)
            assert MixturePlan.of(plan, 1, 12) is not None
        else:
            with pytest.raises(ValueError, match="at most 1,024"):
                check_plan_bounds(plan)


def test_positions_beyond_the_bounds_are_refused_at_commit_and_registration(
    api: TestClient, tmp_path: Path
) -> None:
    run = _run_id(api, tmp_path)
    far = _commit(api, run, 1, 2**40, _params())
    assert far.status_code == 422, far.text
    assert "body.epoch" in far.json()["detail"] and f"{MAX_EPOCHS:,}" in far.json()["detail"]
    late = api.post(
        f"/v1/runs/{run}/checkpoints",
        json={"step": 2**40, "epoch": 0, "sample_in_epoch": 0, "plan": _state(0, 0, _params())},
    )
    assert late.status_code == 422 and "body.step" in late.json()["detail"], late.text
    assert f"{MAX_STEPS:,}" in late.json()["detail"]
    inner = _commit(api, run, 1, 0, {**_params()})
    assert inner.status_code == 201, inner.text
    stated = dict(_state(2**40, 0, _params()))
    body = {"step": 2, "epoch": 0, "sample_in_epoch": 0, "plan": stated}
    wrong = api.post(f"/v1/runs/{run}/checkpoints", json=body)
    assert wrong.status_code == 422 and "plan.epoch" in wrong.json()["detail"], wrong.text
    for resume in ({"step": 1, "epoch": 2**40, "sample_in_epoch": 0},
                   {"step": 2**40, "epoch": 0, "sample_in_epoch": 0}):  # fmt: skip
        body = {"key": "k", "world_size": 1, "resume": resume}
        answer = api.post(f"/v1/runs/{run}/attempts", json=body)
        assert answer.status_code == 422, answer.text
        assert "body.resume" in answer.json()["detail"], answer.text
    assert api.get(f"/v1/runs/{run}/attempts").json()["items"] == []


def test_the_sdk_refuses_a_position_beyond_the_bounds_before_sending(live: LiveServer) -> None:
    """The wire schema is shared: the SDK's commit raises the 422 the server would give,
    naming the field, instead of a pydantic traceback from inside the committer."""
    with APIClient(live.url, token=live.token) as api:
        with pytest.raises(RequestValidationError, match=r"epoch.*at most 1,000,000") as info:
            api.commit_checkpoint(1, step=1, epoch=2**40, sample_in_epoch=0)
        assert info.value.status == 422
        schedule = _linear(1, 2000, 10**6)
        with pytest.raises(RequestValidationError, match=r"plan.*steps 2,000"):
            api.create_run([("a", 1)], global_batch_size=GBS, plan=_params(schedule))


def test_a_scheduled_plan_at_a_huge_epoch_is_refused_not_a_500(
    api: TestClient, tmp_path: Path
) -> None:
    run = _run_id(api, tmp_path)
    schedule = [{"weights": [1.0], "until": 10}, {"weights": [1.0]}]
    params = _params(schedule, epoch_size=1_000_000)  # 500,000 global steps an epoch
    for epoch in (2**62, MAX_EPOCHS + 1):
        answer = _commit(api, run, 1, epoch, params)
        assert answer.status_code == 422, answer.text
        assert "epoch" in answer.json()["detail"]
    # the largest epoch the bound admits is stored and its mixture page answers
    answer = _commit(api, run, 1, MAX_EPOCHS, params)
    assert answer.status_code == 201, answer.text
    assert api.get(f"/v1/runs/{run}/mixture").status_code == 200


def test_a_version_of_huge_shards_cannot_push_a_scheduled_run_past_the_bound(
    api: TestClient, tmp_path: Path
) -> None:
    """Shards that claim 2**60 samples each make an epoch of 2**61 global steps: the run's
    global step at epoch 1,000 is beyond every bound (SQLite could not store its mixture)."""
    root = tmp_path / "huge"
    assert api.post("/v1/datasets", json={"name": "huge"}).status_code == 201
    created = api.post(
        "/v1/datasets/huge/versions", json={"columns": {"x": "int"}, "storage_root": root.as_uri()}
    )
    assert created.status_code == 201, created.text
    root.mkdir()
    shards = []
    for i in range(2):
        (root / f"s{i}.mds").write_bytes(b"x" * 10)
        shards.append(
            {
                "index": i,
                "key": f"s{i}.mds",
                "samples": 2**60,
                "raw_bytes": 10,
                "stored_bytes": 10,
                "hashes": {"sha1": f"{i:040x}"},
            }
        )
    added = api.post("/v1/datasets/huge/versions/1/shards", json={"shards": shards})
    assert added.status_code == 200, added.text
    assert api.post("/v1/datasets/huge/versions/1/publish").status_code == 200
    body = {"sources": [{"dataset": "huge", "version": 1}], "global_batch_size": 1}
    run = api.post("/v1/runs", json=body).json()["id"]
    params = _params([{"weights": [1.0], "until": 10}, {"weights": [1.0]}], global_batch_size=1)
    answer = _commit(api, run, 1, 1000, params, versions=["huge@1"])
    assert answer.status_code == 422, answer.text
    assert "global step" in answer.json()["detail"] and f"{MAX_STEPS:,}" in answer.json()["detail"]
    assert api.get(f"/v1/runs/{run}/checkpoints").json()["items"] == []
    assert api.get(f"/v1/runs/{run}/mixture").status_code == 200


def test_attempt_changes_are_bounded_in_entries_and_bytes(api: TestClient, tmp_path: Path) -> None:
    run = _run_id(api, tmp_path)
    big = [{"epoch": 0, "batch": 0, "changed": {"seed": ["x" * 65_000, 1]}} for _ in range(64)]
    for changes, words in (
        (big, f"at most {MAX_ATTEMPT_CHANGES} items"),
        ([{"changed": {"seed": [0, 1]}}] * (MAX_ATTEMPT_CHANGES + 1), "at most"),
        ([{"changed": {"seed": ["x" * MAX_ATTEMPT_CHANGES_BYTES, 1]}}], "bytes"),
    ):
        body = {"key": "k", "world_size": 1, "changes": changes}
        answer = api.post(f"/v1/runs/{run}/attempts", json=body)
        assert answer.status_code == 422, answer.text[:300]
        assert "body.changes" in answer.json()["detail"] and words in answer.json()["detail"]
    ordinary = [{"epoch": 3, "batch": 7, "changed": {"seed": [17, 18], "window": [None, 64]}}]
    body = {"key": "k", "world_size": 1, "changes": ordinary}
    assert api.post(f"/v1/runs/{run}/attempts", json=body).status_code == 201


def _many_attempts(app: FastAPI, run: int, count: int, change_bytes: int) -> None:
    """``count`` attempts with ``change_bytes`` of changes each, stored directly (as rows
    written before changes were bounded)."""
    changes = [{"epoch": 0, "batch": 0, "changed": {"seed": ["x" * change_bytes, 1]}}]
    with app.state.sessionmaker.begin() as session:
        session.add_all(
            RunAttemptRow(
                run_id=run,
                number=n,
                key=f"k{n}",
                world_size=1,
                start_epoch=0,
                start_sample=0,
                changes=changes,
                created_by="admin",
                created_at=utcnow(),
            )
            for n in range(1, count + 1)
        )


def test_attempts_come_a_bounded_page_at_a_time(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = _run_id(api, tmp_path)
    _many_attempts(app, run, 40, 60_000)  # 2.4 MB of ledger
    first = api.get(f"/v1/runs/{run}/attempts")
    assert first.status_code == 200
    assert len(first.content) <= (1 << 20) + 70_000
    page = first.json()
    numbers = [a["number"] for a in page["items"]]
    while page["next_cursor"] is not None:
        page = api.get(f"/v1/runs/{run}/attempts", params={"cursor": page["next_cursor"]}).json()
        numbers += [a["number"] for a in page["items"]]
    assert numbers == list(range(1, 41))
    few = api.get(f"/v1/runs/{run}/attempts", params={"limit": 3}).json()
    assert [a["number"] for a in few["items"]] == [1, 2, 3] and few["next_cursor"] == "3"


def test_the_audit_answer_is_capped_with_counts(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = _run_id(api, tmp_path)
    _many_attempts(app, run, 40, 60_000)
    answer = api.get(f"/v1/runs/{run}/audit")
    assert answer.status_code == 200
    assert len(answer.content) <= 1 << 20, len(answer.content)
    report = answer.json()
    assert report["attempt_count"] == 40 and report["plan_change_count"] == 40
    assert 0 < len(report["attempts"]) < 40
    assert [a["number"] for a in report["attempts"]] == list(range(1, len(report["attempts"]) + 1))
    console = TestClient(app, follow_redirects=False)
    signed_in = console.post("/ui/login", data={"token": ADMIN, "next": f"/ui/runs/{run}"})
    assert signed_in.status_code == 303, signed_in.text
    page = console.get(f"/ui/runs/{run}")
    assert page.status_code == 200
    assert len(page.content) < 1 << 20
    listed = len(report["attempts"])
    assert page.text.count('<tr id="attempt-') == listed
    assert f"The first {listed} attempts of 40" in page.text


def test_the_terminal_reads_the_attempts_over_pages(
    live: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(live.app, headers=live.headers) as client:  # the live server's own app
        make_published(client, "a", tmp_path / "a", shards=4)
        body = {"sources": [{"dataset": "a", "version": 1}], "global_batch_size": GBS}
        run = client.post("/v1/runs", json=body).json()["id"]
    _many_attempts(live.app, run, 40, 60_000)
    with APIClient(live.url, token=live.token) as api:
        assert [a.number for a in api.list_attempts(run, page_size=7)] == list(range(1, 41))
    where = ["--server", live.url, "--token", live.token]
    capsys.readouterr()
    assert main(["runs", "attempts", str(run), "--json", *where]) == 0
    assert [a["number"] for a in json.loads(capsys.readouterr().out)] == list(range(1, 41))
    assert main(["runs", "attempts", str(run), *where]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 41  # a header and every attempt
    main(["runs", "audit", str(run), *where])
    out = capsys.readouterr().out
    assert f" of 40 attempts; shardstream runs attempts {run}" in out


def test_a_commit_naming_datasets_outside_the_token_is_refused_alike(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """An alpha-only writer learned beta's epoch size from its own audit by committing a
    checkpoint that names beta@1 (and "not on this server" for nosuch@1)."""
    make_published(api, "alpha", tmp_path / "alpha", shards=4)
    make_published(api, "beta", tmp_path / "beta", shards=2)
    minted = api.post("/v1/tokens", json={"name": "w", "scopes": ["write"], "datasets": ["alpha"]})
    assert minted.status_code == 201, minted.text
    headers = {"Authorization": f"Bearer {minted.json()['secret']}"}
    with TestClient(app, headers=headers) as writer:
        body = {"sources": [{"dataset": "alpha", "version": 1}], "global_batch_size": GBS}
        run = writer.post("/v1/runs", json=body).json()["id"]
        answers = {}
        for name in ("beta", "nosuch"):
            answer = _commit(writer, run, 1, 0, _params(), versions=[f"{name}@1"])
            assert answer.status_code == 403, answer.text
            answers[name] = answer.json()["detail"].replace(name, "NAME")
            change = {"changed": {"versions": [["alpha@1"], [f"{name}@1"]]}}
            body = {"key": "k", "world_size": 1, "changes": [change]}
            refused = writer.post(f"/v1/runs/{run}/attempts", json=body)
            assert refused.status_code == 403, refused.text
        assert answers["beta"] == answers["nosuch"]  # existence is not revealed
        assert writer.get(f"/v1/runs/{run}/checkpoints").json()["items"] == []
        assert _commit(writer, run, 1, 0, _params(), versions=["alpha@1"]).status_code == 201
        audit = writer.get(f"/v1/runs/{run}/audit").json()
        assert "beta" not in str(audit)
