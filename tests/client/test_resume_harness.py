"""The resume harness itself: its kill leaves nothing running and its checks can fail.

Uses the harness's toy loader (a plain DataLoader over an id permutation), so that a
failing shardstream resume test means shardstream is wrong, not the harness.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from tests.harness.compare import check_elastic_resume, check_same_world_resume
from tests.harness.config import DataSettings, TrainerConfig
from tests.harness.job import Job, live_group_members
from tests.harness.records import AttemptLog, IdArray
from tests.harness.scenario import attempt, resume_state_dict, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

GLOBAL_BATCH = 32


@pytest.mark.slow
def test_harness_detects_a_loader_that_resumes_one_batch_late(tmp_path: Path) -> None:
    data = DataSettings(source="toy:2048", global_batch_size=GLOBAL_BATCH, num_partitions=4)
    base = TrainerConfig(
        attempt_dir=str(tmp_path / "ref"),
        data=data,
        loader="toy",
        checkpoint_every=8,
        step_sleep_s=0.02,
    )
    ref = run_epoch(base, world_size=2)
    assert ref.last_common_step() == 2048 // GLOBAL_BATCH

    killed_cfg = attempt(base, "killed")
    killed = run_and_kill(killed_cfg, world_size=2, kill_at_step=21)
    assert killed.checkpoint_step in (16, 24, 32)  # the ranks hold after step 34 at the latest

    resume = resume_state_dict(killed_cfg, killed)
    # A loader that lands one batch late on resume is caught (the comparisons accepting
    # a correct resume is what the shardstream tests show).
    skip_data = dataclasses.replace(data, source="toy-skip:2048")
    skipped = run_epoch(attempt(base, "skip", data=skip_data, resume_state_dict=resume), 2)
    with pytest.raises(AssertionError, match="resumed run logged steps"):
        check_same_world_resume(ref, killed.log, skipped, killed.checkpoint_step, GLOBAL_BATCH)


@pytest.mark.slow
def test_kill_takes_down_every_rank_and_worker(tmp_path: Path) -> None:
    cfg = TrainerConfig(
        attempt_dir=str(tmp_path / "a"),
        data=DataSettings(source="toy:100000", global_batch_size=8, num_partitions=2),
        loader="toy",
        hold_after_step=3,
    )
    with Job(cfg, world_size=2) as job:
        job.wait_for_step(3, timeout=120)
        time.sleep(1.0)
        assert job.last_steps() == [3, 3]  # the backstop holds every rank after step 3
        # Two ranks, each with two DataLoader workers, all in the job's process group.
        assert len(live_group_members(job.pgid)) == 2 + 2 * 2
        job.kill()
        assert live_group_members(job.pgid) == []
        assert all(p.returncode == -9 for p in job.procs)


def _log(name: str, world: int, per_rank: int, steps: range, order: IdArray) -> AttemptLog:
    """A synthetic log: step s, rank r holds ``order``'s slice of global batch s - 1."""
    ranks = tuple(
        {s: order[(s - 1) * world * per_rank + r * per_rank :][:per_rank].copy() for s in steps}
        for r in range(world)
    )
    return AttemptLog(attempt_dir=Path(name), world_size=world, ranks=ranks)


def test_checks_catch_reordered_duplicated_and_missing_samples() -> None:
    order = np.random.default_rng(0).permutation(160).astype(np.int64)  # 10 steps x 16
    ref = _log("ref", 4, 4, range(1, 11), order)
    killed = _log("killed", 4, 4, range(1, 7), order)  # checkpoint 4, killed after step 6
    good = _log("resumed", 2, 8, range(5, 11), order)
    report = check_elastic_resume(ref, killed, good, 4, 16)
    assert report.reconsumed_samples == 2 * 16 and report.killed_at == (6, 6, 6, 6)

    swapped = order.copy()
    swapped[[100, 101]] = swapped[[101, 100]]  # two samples of step 7 trade places
    with pytest.raises(AssertionError, match="same samples, other order"):
        check_elastic_resume(ref, killed, _log("r", 2, 8, range(5, 11), swapped), 4, 16)

    duplicated = order.copy()
    duplicated[120] = duplicated[10]  # step 8 re-reads a sample of step 1
    with pytest.raises(AssertionError, match="different samples"):
        check_elastic_resume(ref, killed, _log("r", 2, 8, range(5, 11), duplicated), 4, 16)

    # Same world size: the resumed run must also repeat what was consumed after the
    # checkpoint, sample for sample.
    same = _log("same", 4, 4, range(5, 11), order)
    check_same_world_resume(ref, killed, same, 4, 16)
    with pytest.raises(AssertionError, match="rank 0 of the resumed run logged steps"):
        check_same_world_resume(ref, killed, _log("s", 4, 4, range(6, 11), order), 4, 16)
    with pytest.raises(AssertionError, match="kill must land after"):
        check_same_world_resume(ref, killed, same, 8, 16)
