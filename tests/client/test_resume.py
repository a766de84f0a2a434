"""Proof of resume (DESIGN §4): SIGKILL a real multi-process job mid-epoch and resume it.

Each job is a real ``torch.distributed`` gloo job of separate rank processes (see
:mod:`tests.harness`), each rank reading through :class:`ShardstreamLoader` with
DataLoader-style workers, logging every sample id it consumes, saving the loader's
``state_dict()`` every ``CKPT_EVERY`` steps. The whole job is SIGKILLed mid-epoch (every
rank and worker at once), restarted, resumed from the newest checkpoint all ranks completed,
and the consumed sequence is compared with an uninterrupted run (see
:mod:`tests.harness.compare` for the exact rules, including re-consumption of the steps
between the checkpoint and the kill).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.mds import MDSIndex
from shardstream.plan import EpochPlan, PlanConfig, SourceSpec
from shardstream.shard_builder.publish import register_index
from tests.fixtures.server import LiveServer
from tests.harness.compare import check_elastic_resume, check_reference, check_same_world_resume
from tests.harness.config import DataSettings, ServerResume, TrainerConfig
from tests.harness.datasets import write_id_dataset
from tests.harness.records import AttemptLog
from tests.harness.scenario import attempt, resume_state_dict, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

NUM_SAMPLES = 6144
GLOBAL_BATCH = 64
PARTITIONS = 4
SEED = 1234
STEPS = NUM_SAMPLES // GLOBAL_BATCH  # 96 (tail "drop"; 6144 divides evenly)
CKPT_EVERY = 10
KILL_AT = 35  # the kill lands at step >= 35: checkpoint 30 (40 if the ranks ran ahead)
STEP_SLEEP_S = 0.02  # a stand-in for compute, so the kill lands mid-epoch


@dataclass
class Fixture:
    """The dataset and the uninterrupted reference runs (one per world size, cached)."""

    root: Path
    index: MDSIndex
    refs: dict[int, AttemptLog] = field(default_factory=dict)

    def config(self, name: str, **changes: object) -> TrainerConfig:
        """A trainer config for attempt ``name`` with a cache shared by the test's attempts."""
        base = TrainerConfig(
            attempt_dir=str(self.root / name),
            data=DataSettings(
                source=str(self.root / "data"),
                global_batch_size=GLOBAL_BATCH,
                num_partitions=PARTITIONS,
                seed=SEED,
                cache_dir=str(self.root / "cache"),
            ),
            num_workers=2,
            checkpoint_every=CKPT_EVERY,
            step_sleep_s=STEP_SLEEP_S,
        )
        return attempt(base, name, **changes)

    def reference(self, world_size: int) -> AttemptLog:
        """The uninterrupted epoch on ``world_size`` ranks x 2 workers."""
        if world_size not in self.refs:
            ref = run_epoch(self.config(f"ref-w{world_size}", step_sleep_s=0.0), world_size)
            assert check_reference(ref, GLOBAL_BATCH) == STEPS
            self.refs[world_size] = ref
        return self.refs[world_size]


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fixture]:
    root = tmp_path_factory.mktemp("resume")
    index = write_id_dataset(root / "data", NUM_SAMPLES)
    yield Fixture(root=root, index=index)


@pytest.mark.slow
def test_uninterrupted_runs_follow_the_plan_on_any_world_size(fx: Fixture) -> None:
    """The loader delivers exactly the plan's batches, and 2 and 4 ranks read the same
    global order (the premise of elastic resume)."""
    plan = EpochPlan(
        sources=[SourceSpec(shard_sizes=np.array([s.samples for s in fx.index.shards]))],
        config=PlanConfig(seed=SEED, global_batch_size=GLOBAL_BATCH, num_partitions=PARTITIONS),
        epoch=0,
    )
    assert plan.num_batches == STEPS
    for world_size in (2, 4):
        ref = fx.reference(world_size)
        for step in range(1, STEPS + 1):
            for rank in range(world_size):
                want = np.asarray(plan.rank_batch(step - 1, rank, world_size))
                assert np.array_equal(ref.ranks[rank][step], want), (world_size, step, rank)
    two, four = fx.reference(2), fx.reference(4)
    for step in range(1, STEPS + 1):
        assert np.array_equal(two.global_batch(step), four.global_batch(step)), step


@pytest.mark.slow
def test_same_world_size_resume_from_state_dict(fx: Fixture) -> None:
    """Kill 2 ranks x 2 workers mid-epoch, resume on 2 x 2 from the per-rank state_dict:
    every rank's consumed sequence equals the uninterrupted run's exactly."""
    ref = fx.reference(2)
    killed_cfg = fx.config("same-w2-killed")
    killed = run_and_kill(killed_cfg, 2, kill_at_step=KILL_AT)
    resume = resume_state_dict(killed_cfg, killed)
    resumed = run_epoch(fx.config("same-w2-resumed", resume_state_dict=resume), 2)
    report = check_same_world_resume(ref, killed.log, resumed, killed.checkpoint_step, GLOBAL_BATCH)
    assert report.checkpoint_step % CKPT_EVERY == 0 and report.checkpoint_step >= 30
    # What the killed run consumed after its checkpoint was consumed again after the
    # restart (checked sample for sample in check_same_world_resume).
    after_checkpoint = killed.log.last_common_step() - killed.checkpoint_step
    assert report.reconsumed_samples == after_checkpoint * GLOBAL_BATCH


@pytest.mark.slow
def test_elastic_resume_4_ranks_to_2_ranks_and_2_workers_to_3(fx: Fixture) -> None:
    """Kill 4 ranks x 2 workers mid-epoch, resume on 2 ranks x 3 workers from the 4 ranks'
    state_dicts: the global order equals the uninterrupted run's and every sample of the
    epoch is consumed once (up to the kill, the 4 ranks also match the 4-rank reference
    rank by rank)."""
    killed_cfg = fx.config("w4-killed")
    killed = run_and_kill(killed_cfg, 4, kill_at_step=KILL_AT)
    resume = resume_state_dict(killed_cfg, killed)
    elastic = run_epoch(
        fx.config("w4-resumed-w2x3", num_workers=3, resume_state_dict=resume), world_size=2
    )
    report = check_elastic_resume(
        fx.reference(4), killed.log, elastic, killed.checkpoint_step, GLOBAL_BATCH
    )
    after_checkpoint = killed.log.last_common_step() - killed.checkpoint_step
    assert report.total_steps == STEPS
    assert report.reconsumed_samples == after_checkpoint * GLOBAL_BATCH


@pytest.mark.slow
def test_resume_from_the_servers_latest_checkpoint(
    fx: Fixture, live_server: LiveServer, tmp_path: Path
) -> None:
    """The run commits its loader state to the server at every checkpoint; after the kill
    the restart asks the server for the latest state (``resume="latest"``) and the consumed
    sequence equals the uninterrupted run's.

    The shards are read from the index.json URL: reading a dataset *by name* needs an
    object store that presigns real URLs (tests/e2e covers that with S3); this server's
    local storage root hands out file:// URLs, which the client's HTTP store cannot read.
    """
    # The same shards inside the test's directory: the server registers datasets only under
    # its storage roots.
    shutil.copytree(fx.root / "data", tmp_path / "data")
    with APIClient(live_server.url, live_server.token) as api:
        version = register_index(api, str(tmp_path / "data" / "index.json"), "resume-ids")
        run = api.create_run([("resume-ids", version.number)], global_batch_size=GLOBAL_BATCH)
    env = {"SHARDSTREAM_TOKEN": live_server.token}
    data = dataclasses.replace(
        fx.config("x").data,
        source=str(tmp_path / "data"),
        server=live_server.url,
        run_id=str(run.id),
    )
    killed = run_and_kill(fx.config("server-killed", data=data, commit=True), 2, KILL_AT, env=env)
    with APIClient(live_server.url, live_server.token) as api:
        latest = api.latest_checkpoint(run.id)
    assert latest is not None
    # Commits follow the all-ranks-saved collective, so the server is never ahead of the
    # trainer's newest complete checkpoint, and at most one checkpoint behind it.
    assert latest.step in (killed.checkpoint_step, killed.checkpoint_step - CKPT_EVERY)
    assert latest.sample_in_epoch == latest.step * GLOBAL_BATCH

    resumed_cfg = fx.config("server-resumed", data=data, commit=True, resume_server=ServerResume())
    resumed = run_epoch(resumed_cfg, 2, env=env)
    check_same_world_resume(fx.reference(2), killed.log, resumed, latest.step, GLOBAL_BATCH)
    with APIClient(live_server.url, live_server.token) as api:
        steps = [c.step for c in api.list_checkpoints(run.id)]
    assert steps == list(range(CKPT_EVERY, STEPS + 1, CKPT_EVERY))
