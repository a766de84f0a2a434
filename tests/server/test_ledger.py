"""The consumption ledger (attempts) and the audit, on SQLite and PostgreSQL (issue 24).

A run of 12 samples (4 shards of 3) read in global batches of 2: 6 batches per epoch, one
batch per training step, so step ``s`` is at global sample ``2 s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.server.conftest import make_published

GBS = 2
PER_EPOCH = 6  # batches
PLAN = {
    "seed": 0,
    "global_batch_size": GBS,
    "num_partitions": 1,
    "shuffle": True,
    "tail": "drop",
    "window": None,
    "epoch_size": None,
    "mixture": [[None, None, None]],
}


def _run(api: TestClient, tmp_path: Path) -> int:
    make_published(api, "a", tmp_path / "a", shards=4)
    r = api.post(
        "/v1/runs", json={"sources": [{"dataset": "a", "version": 1}], "global_batch_size": GBS}
    )
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _state(
    step: int, *, algorithm: int = 1, versions: tuple[str, ...] = ("a@1",), changes: Any = ()
) -> dict[str, Any]:
    epoch, batch = divmod(step, PER_EPOCH)
    state = {
        "format": 2,
        "algorithm": algorithm,
        "epoch": epoch,
        "batch": batch,
        "samples": batch * GBS,
        "plan": PLAN,
        "versions": list(versions),
        "weights": [None],
        "fingerprint": f"{algorithm:02x}{'ab' * 15}",
        "worker": None,
        "world_size": 1,
        "session": "s",
    }
    if changes:
        state["changes"] = list(changes)
    return state


def _commit(
    api: TestClient, run: int, step: int, attempt: int | None, *, at: int | None = None, **kw: Any
) -> Any:
    """Commit ``step`` with the position of step ``at`` (default: its own)."""
    state = _state(step if at is None else at, **kw)
    body = {
        "step": step,
        "epoch": state["epoch"],
        "sample_in_epoch": state["samples"],
        "plan": state,
        "attempt": attempt,
    }
    return api.post(f"/v1/runs/{run}/checkpoints", json=body)


def _attempt(
    api: TestClient,
    run: int,
    key: str,
    *,
    world: int = 8,
    step: int | None = None,
    at: int | None = None,
    **extra: Any,
) -> Any:
    body: dict[str, Any] = {"key": key, "world_size": world, "workers": 2, **extra}
    if step is not None or at is not None:
        position = step if at is None else at
        assert position is not None
        epoch, batch = divmod(position, PER_EPOCH)
        body["resume"] = {"step": step, "epoch": epoch, "sample_in_epoch": batch * GBS}
    return api.post(f"/v1/runs/{run}/attempts", json=body)


def _audit(api: TestClient, run: int) -> dict[str, Any]:
    r = api.get(f"/v1/runs/{run}/audit")
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def test_elastic_resumes_across_an_epoch_prove_the_history(api: TestClient, tmp_path: Path) -> None:
    run = _run(api, tmp_path)
    first = _attempt(api, run, "job-a")
    assert first.status_code == 201, first.text
    assert first.json()["number"] == 1
    again = _attempt(api, run, "job-a")  # another rank of the same start joins it
    assert again.status_code == 200 and again.json()["number"] == 1
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    # crash; the job comes back on 4 ranks from the model checkpoint at step 4
    second = _attempt(api, run, "job-b", world=4, step=4)
    assert second.status_code == 201, second.text
    assert second.json()["resumed_step"] == 4 and second.json()["resumed_attempt"] == 1
    assert second.json()["rolled_back_from"] is None
    for step in range(5, 9):  # crosses into epoch 1 at step 6
        assert _commit(api, run, step, 2).status_code == 201
    # and on 6 ranks, resuming from the data position alone (a local loader state)
    third = _attempt(api, run, "job-c", world=6, at=8)
    assert third.status_code == 201 and third.json()["resumed_step"] == 8
    for step in range(9, 14):
        assert _commit(api, run, step, 3).status_code == 201

    report = _audit(api, run)
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
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in (10, 20, 30, 40, 50):
        assert _commit(api, run, step, 1, at=step // 10).status_code == 201
    missing = _attempt(api, run, "b", step=25, at=2)
    assert missing.status_code == 409
    assert "no checkpoint at step 25" in missing.json()["detail"]
    assert "steps 10, 20, 30, 40 and 50" in missing.json()["detail"]
    got = api.get(f"/v1/runs/{run}/checkpoints/25")
    assert got.status_code == 404
    assert "steps 10, 20, 30, 40 and 50" in got.json()["detail"]
    # the loader's position alone matching no checkpoint is refused too
    nowhere = _attempt(api, run, "c", at=6)  # epoch 1 was never reached
    assert nowhere.status_code == 409 and "no checkpoint at the loader" in nowhere.json()["detail"]


def test_model_step_without_its_loader_state_is_refused(api: TestClient, tmp_path: Path) -> None:
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    # the model restored from step 2, the loader state from step 4
    mismatch = _attempt(api, run, "b", step=2, at=4)
    assert mismatch.status_code == 409
    detail = mismatch.json()["detail"]
    assert "trainer is at step 2" in detail and "step 4's position" in detail
    # the model restored, the loader not resumed at all: refused too
    fresh = _attempt(api, run, "c")
    assert fresh.status_code == 409 and "resumes none" in fresh.json()["detail"]
    # resumed by 'latest' (step 4) while the model is at step 2: its first commit says so
    latest = _attempt(api, run, "d", at=4)
    assert latest.status_code == 201
    behind = _commit(api, run, 3, 2, at=5)
    assert behind.status_code == 409 and "resumed the data at step 4" in behind.json()["detail"]
    assert _audit(api, run)["ok"]  # nothing wrong was committed


def test_a_loader_state_that_skips_is_flagged_by_the_audit(api: TestClient, tmp_path: Path) -> None:
    """A loader state restored beside the wrong model step, through a client that cannot
    tell (it resumed by position): the steps go on, the data jumped; the audit sees it."""
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in range(1, 6):
        assert _commit(api, run, step, 1).status_code == 201
    assert _attempt(api, run, "b", at=2).status_code == 201  # rollback by position: step 2
    # ...but the trainer is at step 5 and commits 6, 7 with the loader two steps behind
    assert _commit(api, run, 6, 2, at=3).status_code == 201
    assert _commit(api, run, 7, 2, at=4).status_code == 201
    report = _audit(api, run)
    assert not report["ok"]
    assert any("steps 2 -> 6" in f and "read again" in f for f in report["failures"]), report


def test_rollback_is_allowed_and_recorded(api: TestClient, tmp_path: Path) -> None:
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in range(1, 6):
        assert _commit(api, run, step, 1).status_code == 201
    back = _attempt(api, run, "b", world=2, step=2)
    assert back.status_code == 201
    assert back.json()["rolled_back_from"] == 5
    url = f"/v1/runs/{run}/checkpoints"
    assert api.get(f"{url}/latest").json()["step"] == 2
    gone = api.get(f"{url}/4")
    assert gone.status_code == 404 and "rollback" in gone.json()["detail"]
    # the earlier start may not commit any more
    stale = _commit(api, run, 6, 1)
    assert stale.status_code == 409 and "followed by attempt 2" in stale.json()["detail"]
    # the rollback re-trains steps 3.. (the same data here; a changed state would do too)
    for step in range(3, 8):
        assert _commit(api, run, step, 2).status_code == 201
    assert api.get(f"{url}/4").json()["attempt"] == 2
    report = _audit(api, run)
    assert report["ok"], report["failures"]
    assert report["rollbacks"] == [{"attempt": 2, "from_step": 5, "to_step": 2}]
    assert report["attempts"][1]["discarded_steps"] == 3
    assert [(h["attempt"], h["last_step"]) for h in report["history"]] == [(1, 2), (2, 7)]


def test_ranks_of_one_start_that_disagree_are_refused(api: TestClient, tmp_path: Path) -> None:
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in range(1, 5):
        assert _commit(api, run, step, 1).status_code == 201
    assert _attempt(api, run, "b", step=4).status_code == 201
    mixed = _attempt(api, run, "b", step=3)  # one rank loaded another step's state
    assert mixed.status_code == 409
    assert "mixed up" in mixed.json()["detail"] and "position" in mixed.json()["detail"]


def test_plan_changes_are_listed_when_accepted_and_flagged_when_not(
    api: TestClient, tmp_path: Path
) -> None:
    run = _run(api, tmp_path)
    assert _attempt(api, run, "a", algorithm=1).status_code == 201
    for step in range(1, 3):
        assert _commit(api, run, step, 1).status_code == 201
    change = {"epoch": 0, "batch": 2, "changed": {"algorithm": [1, 2]}}
    bumped = _attempt(api, run, "b", step=2, algorithm=2, changes=[change])
    assert bumped.status_code == 201, bumped.text
    for step in range(3, 5):
        assert _commit(api, run, step, 2, algorithm=2, changes=[change]).status_code == 201
    report = _audit(api, run)
    assert report["ok"], report["failures"]
    assert report["plan_changes"] == [{"attempt": 2, **change}]
    # a start that changes the order without saying so (an old client, a hand-made state)
    assert _attempt(api, run, "c", step=4).status_code == 201
    assert _commit(api, run, 5, 3, algorithm=3).status_code == 201
    report = _audit(api, run)
    assert not report["ok"]
    assert any("algorithm changed (2 -> 3)" in f for f in report["failures"])


def test_a_dataset_version_swapped_under_the_run_is_flagged(
    api: TestClient, tmp_path: Path
) -> None:
    run = _run(api, tmp_path)
    make_published(api, "a", tmp_path / "a2", shards=4)  # a@2, same sizes
    assert _attempt(api, run, "a").status_code == 201
    assert _commit(api, run, 1, 1).status_code == 201
    assert _attempt(api, run, "b", step=1).status_code == 201
    assert _commit(api, run, 2, 2, versions=("a@2",)).status_code == 201
    report = _audit(api, run)
    assert not report["ok"]
    assert any("version was swapped" in f for f in report["failures"])


def test_commits_without_attempts_cannot_be_proven(api: TestClient, tmp_path: Path) -> None:
    run = _run(api, tmp_path)
    assert _commit(api, run, 1, None).status_code == 201
    report = _audit(api, run)
    assert not report["ok"] and "without an attempt" in report["failures"][0]
    assert api.get("/v1/runs/999/audit").status_code == 404
    assert _commit(api, run, 2, 7).status_code == 409  # an attempt never registered


def test_the_run_page_shows_the_verdict_and_the_attempts(
    api: TestClient, app: Any, tmp_path: Path
) -> None:
    from tests.server.test_console import mint, sign_in

    run = _run(api, tmp_path)
    assert _attempt(api, run, "a").status_code == 201
    for step in range(1, 4):
        assert _commit(api, run, step, 1).status_code == 201
    assert _attempt(api, run, "b", world=4, step=2).status_code == 201  # a rollback
    assert _commit(api, run, 3, 2).status_code == 201
    client = sign_in(app, mint(api, "viewer", ["read"]))
    page = client.get(f"/ui/runs/{run}").text
    assert "proven</span> every global batch" in page
    assert 'id="attempt-2"' in page and "from step 3" in page and "step 2 (attempt 1)" in page
    assert _commit(api, run, 4, 2, at=6).status_code == 201  # two steps' data skipped
    page = client.get(f"/ui/runs/{run}").text
    assert "not proven</span> 1 failure" in page and "batches skipped" in page
