"""The resume harness itself: its kill leaves nothing running and its checks can fail.

Uses the harness's toy loader (a plain DataLoader over an id permutation), so that a
failing shardstream resume test means shardstream is wrong, not the harness.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.harness.compare import check_elastic_resume, check_same_world_resume
from tests.harness.config import DataSettings, TrainerConfig
from tests.harness.job import Job, live_group_members
from tests.harness.scenario import attempt, resume_state_dict, run_and_kill, run_epoch

GLOBAL_BATCH = 32


@pytest.mark.slow
def test_harness_detects_a_wrong_resume_and_accepts_a_right_one(tmp_path: Path) -> None:
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
    assert killed.checkpoint_step in (16, 24)  # 24 only if the kill landed past step 24

    # A correct resume passes, on the same and on another world size / worker count ...
    resume = resume_state_dict(killed_cfg, killed)
    same = run_epoch(attempt(base, "same", resume_state_dict=resume), world_size=2)
    report = check_same_world_resume(ref, killed.log, same, killed.checkpoint_step, GLOBAL_BATCH)
    assert report.reconsumed_samples == GLOBAL_BATCH * (
        killed.log.last_common_step() - killed.checkpoint_step
    )
    other = run_epoch(attempt(base, "other", resume_state_dict=resume, num_workers=3), 4)
    check_elastic_resume(ref, killed.log, other, killed.checkpoint_step, GLOBAL_BATCH)

    # ... and a loader that lands one batch late on resume is caught.
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
        step_sleep_s=0.05,
    )
    with Job(cfg, world_size=2) as job:
        job.wait_for_step(3, timeout=60)
        # Two ranks, each with two DataLoader workers, all in the job's process group.
        assert len(live_group_members(job.pgid)) == 2 + 2 * 2
        job.kill()
        assert live_group_members(job.pgid) == []
        assert all(p.returncode == -9 for p in job.procs)
