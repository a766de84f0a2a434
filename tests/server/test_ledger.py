"""The consumption ledger (attempts) and the audit, on SQLite and PostgreSQL (issue 24).

A run of 12 samples (4 shards of 3) read in global batches of 2: 6 batches per epoch, one
batch per training step, so step ``s`` is at global sample ``2 s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.fixtures.ledger_runs import (
    GBS,
    PER_EPOCH,
    get_audit,
    ledger_run,
    post_attempt,
    reader_state,
)
from tests.server.conftest import make_published


def _commit(
    api: TestClient, run: int, step: int, attempt: int | None, *, at: int | None = None, **kw: Any
) -> Any:
    """Commit ``step`` with the position of step ``at`` (default: its own)."""
    state = reader_state(step if at is None else at, **kw)
    body = {
        "step": step,
        "epoch": state["epoch"],
        "sample_in_epoch": state["samples"],
        "plan": state,
        "attempt": attempt,
    }
    return api.post(f"/v1/runs/{run}/checkpoints", json=body)


def test_elastic_resumes_across_an_epoch_prove_the_history(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    first = post_attempt(api, run, "job-a")
    assert first.status_code == 201, first.text
    assert first.json()["number"] == 1
    again = post_attempt(api, run, "job-a")  # another rank of the same start joins it
    assert again.status_code == 200 and again.json()["number"] == 1
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    # crash; the job comes back on 4 ranks from the model checkpoint at step 4
    second = post_attempt(api, run, "job-b", world=4, step=4)
    assert second.status_code == 201, second.text
    assert second.json()["resumed_step"] == 4 and second.json()["resumed_attempt"] == 1
    assert second.json()["rolled_back_from"] is None
    for step in range(5, 9):  # crosses into epoch 1 at step 6
        assert _commit(api, run, step, 2).status_code == 201
    # and on 6 ranks, resuming from the data position alone (a local loader state)
    third = post_attempt(api, run, "job-c", world=6, at=8)
    assert third.status_code == 201 and third.json()["resumed_step"] == 8
    for step in range(9, 14):
        assert _commit(api, run, step, 3).status_code == 201

    report = get_audit(api, run)
    assert report["ok"], report["failures"]
    assert report["samples_per_step"] == GBS
    assert [a["world_size"] for a in report["attempts"]] == [8, 4, 6]
    assert [(h["attempt"], h["first_step"], h["last_step"]) for h in report["history"]] == [
        (1, 1, 4),
        (2, 5, 8),
        (3, 9, 13),
    ]
    assert report["epochs"][0] == {
        "epoch": 0,
        "samples": PER_EPOCH * GBS,
        "consumed_to": PER_EPOCH * GBS,
        "complete": True,
    }
    assert report["epochs"][2]["complete"] is False
    assert report["rollbacks"] == [] and report["plan_changes"] == []


def test_a_resume_at_a_step_without_checkpoint_names_the_nearest(
    api: TestClient, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in (10, 20, 30, 40, 50):
        assert _commit(api, run, step, 1, at=step // 10).status_code == 201
    missing = post_attempt(api, run, "b", step=25, at=2)
    assert missing.status_code == 409
    assert "no checkpoint at step 25" in missing.json()["detail"]
    assert "steps 10, 20, 30, 40 and 50" in missing.json()["detail"]
    got = api.get(f"/v1/runs/{run}/checkpoints/25")
    assert got.status_code == 404
    assert "steps 10, 20, 30, 40 and 50" in got.json()["detail"]
    # the loader's position alone matching no checkpoint is refused too
    nowhere = post_attempt(api, run, "c", at=6)  # epoch 1 was never reached
    assert nowhere.status_code == 409 and "no checkpoint at the loader" in nowhere.json()["detail"]


def test_model_step_without_its_loader_state_is_refused(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    # the model restored from step 2, the loader state from step 4
    mismatch = post_attempt(api, run, "b", step=2, at=4)
    assert mismatch.status_code == 409
    detail = mismatch.json()["detail"]
    assert "trainer is at step 2" in detail and "step 4's position" in detail
    # the model restored, the loader not resumed at all: refused too
    fresh = post_attempt(api, run, "c")
    assert fresh.status_code == 409 and "resumes none" in fresh.json()["detail"]
    # resumed by 'latest' (step 4) while the model is at step 2: its first commit says so
    latest = post_attempt(api, run, "d", at=4)
    assert latest.status_code == 201
    behind = _commit(api, run, 3, 2, at=5)
    assert behind.status_code == 409 and "resumed the data at step 4" in behind.json()["detail"]
    assert get_audit(api, run)["ok"]  # nothing wrong was committed


def _attempts(api: TestClient, run: int) -> list[dict[str, Any]]:
    body = api.get(f"/v1/runs/{run}/attempts").json()
    items: list[dict[str, Any]] = body["items"] if isinstance(body, dict) else body
    return items


def test_a_loader_behind_the_model_is_refused_at_its_first_commit(
    api: TestClient, tmp_path: Path
) -> None:
    """The model restored at step 5, the loader resumed by position at step 2's state: the
    first commit is refused with the audit's own finding; the refusal is in the ledger,
    and nothing of the refused start (its rollback included) happened."""
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 6):
        assert _commit(api, run, step, 1).status_code == 201
    assert post_attempt(api, run, "b", at=2).status_code == 201  # resumed by position: step 2
    behind = _commit(api, run, 6, 2, at=3)  # the trainer at 5 + 1, the data at 2 + 1
    assert behind.status_code == 409, behind.text
    assert (
        "steps 2 -> 6 (attempt 2 resumed): the data advanced 2 samples where the run's 2 "
        "per step make 8: batches read again" in behind.json()["detail"]
    )
    assert api.get(f"/v1/runs/{run}/checkpoints/5").status_code == 200  # no rollback
    assert _attempts(api, run)[1]["refused"] == [[6, 0, 6]]
    # past the epoch it resumed in the server cannot tell at the commit; the audit can
    assert post_attempt(api, run, "c", step=5).status_code == 201
    assert _commit(api, run, 7, 3, at=9).status_code == 201  # two steps, four batches
    report = get_audit(api, run)
    assert not report["ok"]
    assert any("steps 5 -> 7" in f and "batches skipped" in f for f in report["failures"]), report


def test_a_stale_rank_registering_first_abandons_nothing(api: TestClient, tmp_path: Path) -> None:
    """Ranks 0 and 1 resume at step 4, rank 2 from a stale state of step 2, under one
    key: whoever registers first, the start's ranks disagree, none of its commits is
    accepted, and the run's checkpoints stay (a rollback waits for the first commit)."""
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    stale = post_attempt(api, run, "b", step=2)  # rank 2 first
    assert stale.status_code == 201 and stale.json()["rolled_back_from"] is None
    assert api.get(f"/v1/runs/{run}/checkpoints/4").status_code == 200
    good = post_attempt(api, run, "b", step=4)  # ranks 0 and 1
    assert good.status_code == 409 and "mixed up" in good.json()["detail"]
    assert _commit(api, run, 3, 2).status_code == 409  # rank 2 trains alone: refused
    assert api.get(f"/v1/runs/{run}/checkpoints/4").status_code == 200
    assert api.get(f"/v1/runs/{run}/checkpoints/latest").json()["step"] == 4
    disputed = _attempts(api, run)[1]
    assert "position" in disputed["disputed"] and disputed["rolled_back_from"] is None
    # the job started again, every rank at step 4 (the same launcher ids: the same key)
    again = post_attempt(api, run, "b", step=4)
    assert again.status_code == 201 and again.json()["number"] == 3
    assert post_attempt(api, run, "b", step=4).json()["number"] == 3  # its other ranks join
    assert _commit(api, run, 5, 3).status_code == 201
    report = get_audit(api, run)
    assert report["ok"], report["failures"]

    # rank 2 registering last: refused before its first batch, and its start's commits too
    assert post_attempt(api, run, "d", step=5).status_code == 201
    late = post_attempt(api, run, "d", step=4)
    assert late.status_code == 409
    refused = _commit(api, run, 6, 4)
    assert refused.status_code == 409 and "ranks disagree" in refused.json()["detail"]


def test_a_launcher_reusing_its_ids_is_a_new_start_once_the_old_one_committed(
    api: TestClient, tmp_path: Path
) -> None:
    """``torchrun`` started twice by hand gives both starts the same ids: the second is
    a new attempt, not a rank of the first that disagrees."""
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "job-x").status_code == 201
    for step in range(1, 4):
        assert _commit(api, run, step, 1).status_code == 201
    second = post_attempt(api, run, "job-x", step=3)
    assert second.status_code == 201, second.text
    assert second.json()["number"] == 2 and second.json()["resumed_step"] == 3
    assert _commit(api, run, 4, 2).status_code == 201
    assert get_audit(api, run)["ok"]


def test_an_old_job_replaying_a_step_is_refused(api: TestClient, tmp_path: Path) -> None:
    """A commit of an earlier start is refused even where its state equals the stored one
    (the replay shortcut answered ``200 unchanged`` before checking the attempt)."""
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    assert post_attempt(api, run, "b", step=4).status_code == 201
    old = _commit(api, run, 4, 1)
    assert old.status_code == 409 and "followed by attempt 2" in old.json()["detail"]


def test_a_loader_of_other_data_than_the_run_is_refused(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    make_published(api, "b", tmp_path / "b", shards=4)
    batch = post_attempt(api, run, "a", global_batch_size=4, versions=["a@1"])
    assert batch.status_code == 409
    assert "global_batch_size is 4" in batch.json()["detail"]
    assert "global batches of 2" in batch.json()["detail"]
    other = post_attempt(api, run, "a", global_batch_size=GBS, versions=["b@1"])
    assert other.status_code == 409
    assert "reads ['a@1'], but this loader reads ['b@1'] (versions)" in other.json()["detail"]
    assert _attempts(api, run) == []
    # a local index.json has no name on the server: the audit judges it
    local = post_attempt(api, run, "a", global_batch_size=GBS, versions=["9f" * 8])
    assert local.status_code == 201, local.text


def test_a_start_resuming_where_a_refused_start_saved_is_not_proven(
    api: TestClient, tmp_path: Path
) -> None:
    """The model of step 2 restored beside the loader's 'latest' (step 4): its commit of
    step 4 is refused, but its trainer saved a model of step 4 first; a restart at step 4
    may load that model: the audit must not prove that history."""
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    assert post_attempt(api, run, "b", step=4).status_code == 201  # resume="latest"
    assert _commit(api, run, 4, 2, at=6).status_code == 409  # steps 3, 4 of the model
    assert post_attempt(api, run, "c", step=4).status_code == 201
    assert _commit(api, run, 5, 3).status_code == 201
    report = get_audit(api, run)
    assert not report["ok"]
    assert any(
        "attempt 3 resumed from step 4" in f and "attempt 2" in f for f in report["failures"]
    ), report


def test_rollback_is_allowed_and_recorded(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 6):
        assert _commit(api, run, step, 1).status_code == 201
    back = post_attempt(api, run, "b", world=2, step=2)
    assert back.status_code == 201
    assert back.json()["rolled_back_from"] is None  # applied by its first commit
    url = f"/v1/runs/{run}/checkpoints"
    assert api.get(f"{url}/latest").json()["step"] == 5
    # the earlier start may not commit any more
    stale = _commit(api, run, 6, 1)
    assert stale.status_code == 409 and "followed by attempt 2" in stale.json()["detail"]
    # the rollback re-trains steps 3.. (the same data here; a changed state would do too)
    assert _commit(api, run, 3, 2).status_code == 201
    assert _attempts(api, run)[1]["rolled_back_from"] == 5
    assert api.get(f"{url}/latest").json()["step"] == 3
    gone = api.get(f"{url}/5")
    assert gone.status_code == 404 and "rollback" in gone.json()["detail"]
    for step in range(4, 8):
        assert _commit(api, run, step, 2).status_code == 201
    assert api.get(f"{url}/4").json()["attempt"] == 2
    report = get_audit(api, run)
    assert report["ok"], report["failures"]
    assert report["rollbacks"] == [{"attempt": 2, "from_step": 5, "to_step": 2}]
    assert report["attempts"][1]["discarded_steps"] == 3
    assert [(h["attempt"], h["last_step"]) for h in report["history"]] == [(1, 2), (2, 7)]


def test_ranks_of_one_start_that_disagree_are_refused(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    assert post_attempt(api, run, "b", step=4).status_code == 201
    mixed = post_attempt(api, run, "b", step=3)  # one rank loaded another step's state
    assert mixed.status_code == 409
    assert "mixed up" in mixed.json()["detail"] and "position" in mixed.json()["detail"]


def test_plan_changes_are_listed_when_accepted_and_flagged_when_not(
    api: TestClient, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a", algorithm=1).status_code == 201
    for step in range(1, 3):
        assert _commit(api, run, step, 1).status_code == 201
    change = {"epoch": 0, "batch": 2, "changed": {"algorithm": [1, 2]}}
    bumped = post_attempt(api, run, "b", step=2, algorithm=2, changes=[change])
    assert bumped.status_code == 201, bumped.text
    for step in range(3, 5):
        assert _commit(api, run, step, 2, algorithm=2, changes=[change]).status_code == 201
    report = get_audit(api, run)
    assert report["ok"], report["failures"]
    assert report["plan_changes"] == [{"attempt": 2, **change}]
    # a start that changes the order without saying so (an old client, a hand-made state)
    assert post_attempt(api, run, "c", step=4).status_code == 201
    assert _commit(api, run, 5, 3, algorithm=3).status_code == 201
    report = get_audit(api, run)
    assert not report["ok"]
    assert any("algorithm changed (2 -> 3)" in f for f in report["failures"])


def test_a_dataset_version_swapped_under_the_run_is_flagged(
    api: TestClient, tmp_path: Path
) -> None:
    run = ledger_run(api, tmp_path)
    make_published(api, "a", tmp_path / "a2", shards=4)  # a@2, same sizes
    assert post_attempt(api, run, "a").status_code == 201
    assert _commit(api, run, 1, 1).status_code == 201
    assert post_attempt(api, run, "b", step=1).status_code == 201
    assert _commit(api, run, 2, 2, versions=("a@2",)).status_code == 201
    report = get_audit(api, run)
    assert not report["ok"]
    assert any("version was swapped" in f for f in report["failures"])


def test_commits_without_attempts_cannot_be_proven(api: TestClient, tmp_path: Path) -> None:
    run = ledger_run(api, tmp_path)
    assert _commit(api, run, 1, None).status_code == 201
    report = get_audit(api, run)
    assert not report["ok"] and "without an attempt" in report["failures"][0]
    assert api.get("/v1/runs/999/audit").status_code == 404
    assert _commit(api, run, 2, 7).status_code == 409  # an attempt never registered


def test_the_run_page_shows_the_verdict_and_the_attempts(
    api: TestClient, app: Any, tmp_path: Path
) -> None:
    from tests.fixtures.console import mint, sign_in

    run = ledger_run(api, tmp_path)
    assert post_attempt(api, run, "a").status_code == 201
    for step in range(1, 4):
        assert _commit(api, run, step, 1).status_code == 201
    assert post_attempt(api, run, "b", world=4, step=2).status_code == 201  # a rollback
    assert _commit(api, run, 3, 2).status_code == 201
    client = sign_in(app, mint(api, "viewer", ["read"]))
    page = client.get(f"/ui/runs/{run}").text
    assert "proven</span> every global batch" in page
    assert 'id="attempt-2"' in page and "from step 3" in page and "step 2 (attempt 1)" in page
    assert _commit(api, run, 4, 2, at=6).status_code == 201  # two steps' data skipped
    page = client.get(f"/ui/runs/{run}").text
    assert "not proven</span> 1 failure" in page and "batches skipped" in page
