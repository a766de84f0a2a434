"""The audit's verdict (issues 35 and 36), on SQLite and PostgreSQL: order changes are
accepted only by the attempt that recorded them, the order and positions are recomputed
from the stored plan (not the client's fingerprint string), an unfinished run is "proven
so far", and the audit is bounded in time and size.

The run is test_ledger's: 12 samples in global batches of 2, one batch per step.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.api_client.cli import _audit as cli_audit
from shardstream.plan import MixtureSchedule, Phase
from shardstream.server.data import audit as audit_data
from shardstream.server.data.audit_plans import plan_facts
from shardstream.server.models import CheckpointRow
from tests.fixtures.ledger_runs import PER_EPOCH, get_audit, ledger_run, post_attempt, reader_state


def _commit(
    api: TestClient,
    run: int,
    step: int,
    attempt: int | None,
    *,
    at: int | None = None,
    sample: int | None = None,
    epoch: int | None = None,
    changes: Any = (),
    versions: tuple[str, ...] = ("a@1",),
    **params: Any,
) -> Any:
    """Commit ``step`` at the position of step ``at`` (or ``epoch``/``sample``), with the
    plan parameters ``params`` changed and the fingerprint string left as it was."""
    state = copy.deepcopy(
        reader_state(step if at is None else at, changes=changes, versions=versions)
    )
    state["plan"].update(params)
    body = {
        "step": step,
        "epoch": state["epoch"] if epoch is None else epoch,
        "sample_in_epoch": state["samples"] if sample is None else sample,
        "plan": state,
        "attempt": attempt,
    }
    answer = api.post(f"/v1/runs/{run}/checkpoints", json=body)
    assert answer.status_code == 201, answer.text
    return answer


def _seed_change(old: int, new: int, batch: int) -> dict[str, Any]:
    return {"epoch": 0, "batch": batch, "changed": {"seed": [old, new]}}


def test_a_change_passes_only_in_the_attempt_that_recorded_it(
    api: TestClient, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in (1, 2):
        _commit(api, run, step, 1, seed=17)
    first = [_seed_change(17, 18, 2)]
    assert post_attempt(api, run, "b", step=2, changes=first).status_code == 201
    for step in (3, 4):
        _commit(api, run, step, 2, seed=18, changes=first)
    report = get_audit(api, run)
    assert report["ok"], report["failures"]
    assert [c["attempt"] for c in report["plan_changes"]] == [1 + 1]
    # The next start changes the seed again, carrying only the change it inherited.
    assert post_attempt(api, run, "c", step=4, changes=first).status_code == 201
    _commit(api, run, 5, 3, seed=19, changes=first)
    report = get_audit(api, run)
    assert report["verdict"] == "not_proven"
    assert any("seed changed (18 -> 19)" in f for f in report["failures"]), report["failures"]


def test_a_recorded_change_must_explain_the_order_read(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    _commit(api, run, 1, 1, seed=17)
    says = [_seed_change(17, 18, 1)]
    assert post_attempt(api, run, "b", step=1, changes=says).status_code == 201
    _commit(api, run, 2, 2, seed=20, changes=says)  # reads seed 20, recorded 18
    report = get_audit(api, run)
    assert any("does not explain" in f for f in report["failures"]), report["failures"]


def test_the_order_is_recomputed_not_taken_from_the_fingerprint_string(
    api: TestClient, tmp_path: Path
) -> None:
    """A resume with the seed changed, or shuffle turned off, that carries the old
    fingerprint string and records nothing."""
    changed: list[tuple[str, Any]] = [("seed", 5), ("shuffle", False)]
    for name, value in changed:
        run = ledger_run(api, tmp_path / name)
        assert post_attempt(api, run, "a").status_code == 201
        for step in (1, 2):
            _commit(api, run, step, 1)
        assert post_attempt(api, run, "b", step=2).status_code == 201
        params: dict[str, Any] = {name: value}
        _commit(api, run, 3, 2, **params)
        report = get_audit(api, run)
        assert report["verdict"] == "not_proven", report
        assert any(f"{name} changed" in f for f in report["failures"]), report["failures"]


def test_positions_off_the_global_batch_and_epoch_jumps_are_flagged(
    api: TestClient, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path / "odd")
    assert post_attempt(api, run, "a").status_code == 201
    for step in (1, 2, 3):
        _commit(api, run, step, 1, epoch=0, sample=3 * step)  # 3 a step, batches of 2
    failures = get_audit(api, run)["failures"]
    assert any("not at the end of a global batch of 2" in f for f in failures), failures
    assert any("3 samples per step, not a whole number" in f for f in failures), failures

    run = ledger_run(api, tmp_path / "far")
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 14):
        _commit(api, run, step, 1)
    _commit(api, run, 14, 1, epoch=20_000, sample=0)
    report = get_audit(api, run)
    assert report["verdict"] == "not_proven"
    assert any("steps 13 -> 14" in f and "batches skipped" in f for f in report["failures"])


def test_an_unfinished_run_is_proven_so_far_and_a_completed_one_must_end_an_epoch(
    api: TestClient, tmp_path: Path
) -> None:

    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in (1, 2, 3):
        _commit(api, run, step, 1)
    report = get_audit(api, run)
    assert report["ok"] and report["verdict"] == "proven_so_far"
    assert "PROVEN so far" in report["verdict_text"]
    assert "epoch 0 at 6 of 12" in report["verdict_text"]
    assert api.patch(f"/v1/runs/{run}", json={"status": "completed"}).status_code == 200
    report = get_audit(api, run)  # stopped at step 3 of the epoch's 6
    assert report["verdict"] == "not_proven"
    assert any("marked completed" in f and "inside an epoch" in f for f in report["failures"])
    # The same run carried to the end of its epoch is proven.
    run = ledger_run(api, tmp_path / "whole")
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, PER_EPOCH + 1):
        _commit(api, run, step, 1)
    assert api.patch(f"/v1/runs/{run}", json={"status": "completed"}).status_code == 200
    report = get_audit(api, run)
    assert report["verdict"] == "proven", report["failures"]


def test_the_cli_exit_status_names_the_verdict(capsys: Any) -> None:
    args = argparse.Namespace(json=True)
    base = {"run": 1, "checkpoints": 1, "latest_step": 1, "samples_per_step": 2}
    statuses = {"proven": 0, "not_proven": 1, "proven_so_far": 3, "cannot_prove": 4}
    for verdict, status in statuses.items():
        assert cli_audit(args, {**base, "verdict": verdict, "ok": True}) == status
    capsys.readouterr()


def test_a_path_sourced_run_leads_with_the_swapped_version(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    _commit(api, run, 1, 1, versions=("idx-5f0c3a9e71d2b4c8",))
    report = get_audit(api, run)
    assert "a dataset version was swapped" in report["failures"][0], report["failures"]
    assert not any("invalid literal" in f for f in report["failures"] + report["unproven"])


def _insert(app: FastAPI, run: int, rows: list[tuple[int, int, int, dict[str, Any]]]) -> None:
    """Checkpoints as an older server stored them (it did not bound what it accepted)."""
    with app.state.sessionmaker() as session:
        for step, epoch, sample, plan in rows:
            session.add(
                CheckpointRow(
                    run_id=run, step=step, epoch=epoch, sample_in_epoch=sample, plan=plan,
                    attempt=1,
                )
            )  # fmt: skip
        session.commit()


def test_huge_schedules_and_epochs_cost_what_small_ones_do(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """64 linear phases of a million steps each, a phase of 2**40 steps, a position at
    epoch 2**40: the epoch size is computed without expanding the schedule, once."""
    ramps = [
        Phase(until=(i + 1) * 10**6, weights=(1,), end_weights=(2,), steps=10**6) for i in range(64)
    ]
    huge = MixtureSchedule([*ramps, Phase(weights=(1,))]).to_params()
    wide = [{"weights": [1], "end_weights": [2], "steps": 2**40, "until": 2**41}, {"weights": [1]}]
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    rows = []
    for step, schedule in enumerate([huge, wide, huge], start=1):
        state = copy.deepcopy(reader_state(step))
        state["plan"]["schedule"] = schedule
        state["plan"]["mixture"] = [[None, None, None]]
        rows.append((step, 0, 2 * step, state))
    far = copy.deepcopy(rows[-1][3])
    rows.append((4, 2**40, 0, far))
    _insert(app, run, rows)
    with app.state.sessionmaker() as session:
        facts = plan_facts(session, rows[0][3]["plan"], ("a@1",))
        assert facts.size == 12 and facts.batch == 2, facts
        report = audit_data.audit(session, run)
    assert report["verdict"] == "not_proven"  # the jump to epoch 2**40
    assert any("steps 3 -> 4" in f and "batches skipped" in f for f in report["failures"])
    page = api.get(f"/v1/runs/{run}/mixture")
    assert page.status_code == 200


def test_the_audit_answers_within_its_deadline(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in (1, 2, 3):
        _commit(api, run, step, 1)
    with app.state.sessionmaker() as session:
        report = audit_data.audit(session, run, deadline_s=0)
    assert report["verdict"] == "cannot_prove" and not report["ok"]
    assert "cannot be proven within the bound" in report["unproven"][0]


def test_the_answer_stays_small_whatever_the_history(
    api: TestClient, app: FastAPI, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(audit_data, "MAX_ROWS", 5)
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    # 120 steps each in an epoch of its own at an odd sample, with a long version list.
    state = reader_state(1)
    rows = [(step, step, 1, {**state, "versions": ["x" * 5000]}) for step in range(1, 121)]
    _insert(app, run, rows)
    report = get_audit(api, run)
    assert report["failure_count"] >= 120
    assert len(report["failures"]) == audit_data.MAX_FINDINGS
    assert all(len(f) <= audit_data.MAX_TEXT for f in report["failures"])
    assert len(report["epochs"]) == 5 and report["epoch_count"] == 120
    assert len(json.dumps(report)) < 200_000
