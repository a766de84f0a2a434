"""The run's ledger proven through real processes (issue 24, DESIGN §4).

One run on a real server (on SQLite, and on PostgreSQL), three starts of a real
``torch.distributed`` gloo job (see :mod:`tests.harness`): 8 ranks, SIGKILLed
mid-epoch; 4 ranks resumed at the step of the server's newest checkpoint (the trainer's
model step), SIGKILLed again; 6 ranks resumed the same way to the end of the epoch.
Rank 0 commits the loader's state after every checkpoint all ranks saved. Then:

* the consumed sequence (each start's steps up to the next start's resume point) is the
  plan's global order, every sample of the epoch exactly once;
* ``shardstream runs audit RUN`` exits 0 and lists the three starts (8, 4 and 6 ranks,
  each resumed from the previous one's checkpoint).

And the failure the field reports most: between the kills, a restart whose trainer
restored the model of the newest step beside the loader state of another checkpoint is
refused by every rank before its first batch (no step logged, no attempt recorded).

Sizes stay small (8 ranks share the machine's cores): 768 samples, global batches of 24
(divisible by 8, 4 and 6), 32 steps, a checkpoint every 4, no DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.shard_builder.publish import register_index
from tests.fixtures.audit_cli import audit_cli
from tests.fixtures.plans import default_plan
from tests.fixtures.server import LiveServer, server_storage_roots, start_server
from tests.harness.config import DataSettings, ServerResume, StateDictResume, TrainerConfig
from tests.harness.datasets import write_id_dataset
from tests.harness.job import Job, JobError
from tests.harness.records import AttemptLog, complete_checkpoint_steps
from tests.harness.scenario import attempt, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

GLOBAL_BATCH = 24
STEPS = 32
NUM_SAMPLES = GLOBAL_BATCH * STEPS
CKPT_EVERY = 4
SEED = 11


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """A fresh server on each database (datasets registered in place under ``tmp_path``)."""
    url = None if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    roots = server_storage_roots(tmp_path, request)
    with start_server(tmp_path / "server", database_url=url, storage_roots=roots) as server:
        yield server


def _latest(api: APIClient, run: int) -> int:
    latest = api.latest_checkpoint(run)
    assert latest is not None, f"run {run} has no checkpoint on the server"
    assert latest.sample_in_epoch == latest.step * GLOBAL_BATCH
    return latest.step


def _check_steps(log: AttemptLog, first: int, last: int, plan: object) -> None:
    """Steps ``first..last`` of every rank of ``log`` are the plan's global batches."""
    for step in range(first, last + 1):
        want = plan.global_batches(step - 1, step)  # type: ignore[attr-defined]
        got = log.global_batch(step)
        assert np.array_equal(got, want), f"{log.attempt_dir.name} step {step}: {got} != {want}"


@pytest.mark.slow
def test_elastic_8_4_6_ranks_with_kills_is_proven_by_the_audit(
    tmp_path: Path, ledger_server: LiveServer
) -> None:
    live_server = ledger_server
    index = write_id_dataset(tmp_path / "data", NUM_SAMPLES, min_shard=30, max_shard=120)
    with APIClient(live_server.url, live_server.token) as api:
        version = register_index(api, str(tmp_path / "data" / "index.json"), "ledger-ids")
        run = api.create_run([("ledger-ids", version.number)], global_batch_size=GLOBAL_BATCH).id
    env = {"SHARDSTREAM_TOKEN": live_server.token}
    base = TrainerConfig(
        attempt_dir=str(tmp_path / "x"),
        data=DataSettings(
            source="ledger-ids",  # by name: the run's version (an index.json path is not)
            global_batch_size=GLOBAL_BATCH,
            seed=SEED,
            cache_dir=str(tmp_path / "cache"),
            server=live_server.url,
            run_id=str(run),
        ),
        num_workers=0,
        checkpoint_every=CKPT_EVERY,
        commit=True,
        step_sleep_s=0.02,
    )
    sizes = np.array([s.samples for s in index.shards], dtype=np.int64)
    plan = default_plan(sizes, GLOBAL_BATCH, 8, SEED, 0)  # the run's first start: 8 ranks
    assert plan.num_batches == STEPS

    # 1. 8 ranks, killed after step 9 (checkpoints 4 and 8 saved; the ranks hold at 11).
    w8_cfg = attempt(base, "w8", hold_after_step=11)
    w8 = run_and_kill(w8_cfg, 8, kill_at_step=9, env=env)
    with APIClient(live_server.url, live_server.token) as api:
        s1 = _latest(api, run)
    assert s1 <= w8.checkpoint_step  # commits follow the all-ranks-saved collective
    _check_steps(w8.log, 1, w8.log.last_common_step(), plan)

    # 2. Refused: the trainer restored the model of step s1 and the loader state another
    # checkpoint of the killed job saved. Every rank stops before its first batch.
    other = max(s for s in complete_checkpoint_steps(Path(w8_cfg.attempt_dir), 8) if s != s1)
    wrong = StateDictResume(w8_cfg.attempt_dir, step=other, world_size=8, model_step=s1)
    wrong_cfg = attempt(base, "w2-wrong-pair", resume_state_dict=wrong)
    with Job(wrong_cfg, 2, env=env) as job, pytest.raises(JobError) as refused:
        job.wait(timeout=300)
    message = str(refused.value)
    assert f"the trainer is at step {s1}" in message, message
    assert "ResumeError" in message and "model and the data would not match" in message
    assert AttemptLog.read(Path(wrong_cfg.attempt_dir), 2).last_common_step() == 0
    with APIClient(live_server.url, live_server.token) as api:
        assert len(api.list_attempts(run)) == 1  # the refused start left no trace
        assert _latest(api, run) == s1

    # 3. 4 ranks resume at the model's step s1, killed 9 steps later (two checkpoints).
    w4_cfg = attempt(base, "w4", resume_server=ServerResume(s1), hold_after_step=s1 + 10)
    w4 = run_and_kill(w4_cfg, 4, kill_at_step=s1 + 9, env=env)
    assert w4.log.first_step() == s1 + 1
    with APIClient(live_server.url, live_server.token) as api:
        s2 = _latest(api, run)
    assert s1 < s2 <= w4.checkpoint_step
    _check_steps(w4.log, s1 + 1, w4.log.last_common_step(), plan)

    # 4. 6 ranks resume at s2 and finish the epoch.
    w6 = run_epoch(attempt(base, "w6", resume_server=ServerResume(s2)), 6, env=env)
    assert w6.first_step() == s2 + 1 and w6.last_common_step() == STEPS
    _check_steps(w6, s2 + 1, STEPS, plan)

    # The effective history: every sample of the epoch exactly once, in the plan's order.
    history = [w8.log.global_batch(s) for s in range(1, s1 + 1)]
    history += [w4.log.global_batch(s) for s in range(s1 + 1, s2 + 1)]
    history += [w6.global_batch(s) for s in range(s2 + 1, STEPS + 1)]
    consumed = np.concatenate(history)
    assert np.array_equal(np.sort(consumed), np.arange(NUM_SAMPLES))

    # And the server proves the same from its ledger alone: while the run is open, so far
    # (exit 3); marked completed at the epoch's end, proven (exit 0).
    code, report = audit_cli(live_server, run)
    assert code == 3 and report["verdict"] == "proven_so_far", report["failures"]
    with APIClient(live_server.url, live_server.token) as api:
        api.set_run_status(run, "completed")
    code, report = audit_cli(live_server, run)
    assert code == 0 and report["verdict"] == "proven" and report["ok"], report["failures"]
    assert report["samples_per_step"] == GLOBAL_BATCH
    assert report["latest_step"] == STEPS
    starts = [(a["world_size"], a["resumed_step"]) for a in report["attempts"]]
    assert starts == [(8, None), (4, s1), (6, s2)]
    assert [h["attempt"] for h in report["history"]] == [1, 2, 3]
    assert report["rollbacks"] == [] and report["plan_changes"] == []
    epoch = report["epochs"][0]
    assert (epoch["epoch"], epoch["samples"], epoch["consumed_to"]) == (
        0,
        NUM_SAMPLES,
        NUM_SAMPLES,
    )


@pytest.mark.slow
def test_a_stale_rank_of_a_start_is_refused_and_rolls_nothing_back(
    tmp_path: Path, ledger_server: LiveServer
) -> None:
    """3 ranks resume a run whose latest checkpoint is at step 32: ranks 0 and 1 at step
    28, rank 2 from a stale state of step 24. The ranks of one launch register under one
    key, so whichever registers first, the server sees them disagree: the start fails
    before any rank trains a step, none of its commits is accepted, and no rollback
    happens (checkpoints 28 and 32 stay); a correct restart at 28 then trains and the
    audit proves the run. Before, the ranks registered apart: a stale rank 2 first rolled
    the run back to 24 (checkpoint 28 gone, ranks 0 and 1 refused), or last trained at
    another position than its peers."""
    live_server = ledger_server
    write_id_dataset(tmp_path / "data", NUM_SAMPLES, min_shard=30, max_shard=120)
    with APIClient(live_server.url, live_server.token) as api:
        version = register_index(api, str(tmp_path / "data" / "index.json"), "ledger-ids")
        run = api.create_run([("ledger-ids", version.number)], global_batch_size=GLOBAL_BATCH).id
    env = {"SHARDSTREAM_TOKEN": live_server.token}
    base = TrainerConfig(
        attempt_dir=str(tmp_path / "x"),
        data=DataSettings(
            source="ledger-ids",
            global_batch_size=GLOBAL_BATCH,
            seed=SEED,
            cache_dir=str(tmp_path / "cache"),
            server=live_server.url,
            run_id=str(run),
        ),
        num_workers=0,
        checkpoint_every=CKPT_EVERY,
        commit=True,
        commit_all_ranks=True,  # a surviving stale rank would commit too
        collective_timeout_s=60.0,
    )
    first = run_epoch(attempt(base, "first"), 3, env=env)
    assert first.last_common_step() == STEPS

    stale = ServerResume(STEPS - CKPT_EVERY, ranks={"2": STEPS - 2 * CKPT_EVERY})
    mixed_cfg = attempt(base, "mixed", resume_server=stale)
    with Job(mixed_cfg, 3, env=env) as job, pytest.raises(JobError) as refused:
        job.wait(timeout=300)
    message = str(refused.value)
    assert "ResumeError" in message and "mixed up" in message, message
    assert "position" in message, message
    assert AttemptLog.read(Path(mixed_cfg.attempt_dir), 3).last_common_step() == 0
    with APIClient(live_server.url, live_server.token) as api:
        latest = api.latest_checkpoint(run)
        assert latest is not None and latest.step == STEPS  # nothing rolled back
        assert api.get_checkpoint(run, STEPS - CKPT_EVERY).attempt == 1
        attempts = api.list_attempts(run)
        assert attempts[1].disputed is not None
        assert all(a.rolled_back_from is None for a in attempts)
    # (a rank that registers after the dispute may take an attempt of its own, which its
    # start's failure leaves without commits: the restart below is the next one)
    restart = len(attempts) + 1

    # every rank at step 28: a rollback of one checkpoint, applied by its first commit
    good = run_epoch(
        attempt(base, "good", resume_server=ServerResume(STEPS - CKPT_EVERY)), 3, env=env
    )
    assert good.first_step() == STEPS - CKPT_EVERY + 1 and good.last_common_step() == STEPS
    _, report = audit_cli(live_server, run)  # the run is not marked completed
    assert report["failures"] == [] and report["failure_count"] == 0, report
    assert report["rollbacks"] == [
        {"attempt": restart, "from_step": STEPS, "to_step": STEPS - CKPT_EVERY}
    ]
    assert [(h["attempt"], h["last_step"]) for h in report["history"]] == [
        (1, STEPS - CKPT_EVERY),
        (restart, STEPS),
    ]
