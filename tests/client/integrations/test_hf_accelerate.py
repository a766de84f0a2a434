"""shardstream in a bare ``accelerate`` loop: the loader's position rides in
``accelerator.save_state``; a job SIGKILLed after a save and resumed with ``load_state``
trains on exactly the samples of an uninterrupted run, saved on 2 ranks and resumed on 3;
``dispatch_batches=True`` is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import ConfigError
from tests.client.integrations.launch import (
    RankJob,
    global_batches,
    plan_batches,
    steps_of,
    write_random_tokens,
)

JOB = "tests.client.integrations.accelerate_job"
GLOBAL_BATCH = 12
STEPS = 10  # 8 global batches an epoch
SEED = 7


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 samples of 32 token ids in 6 shards: 8 global batches an epoch."""
    out = tmp_path_factory.mktemp("accelerate") / "tokens"
    return str(write_random_tokens(out, 96, 32, size_limit=1200, seed=1))


def _cfg(attempt: Path, out: Path, data: str, world: int, **extra: Any) -> dict[str, Any]:
    return {
        "attempt": str(attempt), "data": data, "output_dir": str(out),
        "batch_size": GLOBAL_BATCH // world, "max_steps": STEPS, "save_steps": 4, "seed": SEED,
        **extra,
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(360)
def test_sigkilled_accelerate_loop_resumes_exactly_on_3_ranks(tokens: str, tmp_path: Path) -> None:
    """2 ranks SIGKILLed while at step 6 (step-4 saved, step 5 trained and lost), resumed
    with ``load_state`` on 3: steps 5..10 (across the epoch's end at 8) are the plan's
    global batches (:func:`plan_batches`, the uninterrupted run's sequence)."""
    reference = plan_batches(tokens, GLOBAL_BATCH, STEPS, SEED)
    first = tmp_path / "first"
    with RankJob(JOB, _cfg(first, first / "out", tokens, 2, hang_at=6), 2) as job:
        job.wait_for_files("hang", timeout=300)
        job.kill()
    assert global_batches(steps_of(first, 2)) == {s: reference[s] for s in range(1, 6)}

    again = tmp_path / "again"
    shutil.copytree(first / "out", again / "out")
    with RankJob(JOB, _cfg(again, again / "out", tokens, 3, resume=True), 3) as job:
        job.wait(timeout=300)
    resumed = global_batches(steps_of(again, 3))
    assert resumed == {s: reference[s] for s in range(5, STEPS + 1)}


def test_dispatch_batches_true_is_refused_in_one_line(tokens: str) -> None:
    from accelerate import Accelerator, DataLoaderConfiguration

    from shardstream.client import ShardstreamLoader, StreamingDataset
    from shardstream.integrations.hf_accelerate import prepare_loader

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=True)
    )
    loader = ShardstreamLoader(StreamingDataset(tokens, 4), num_workers=0)
    with pytest.raises(ConfigError, match=r"dispatch_batches=\.\.\.\)\)=True makes rank 0") as e:
        prepare_loader(accelerator, loader)
    assert "\n" not in str(e.value)


def test_loader_of_another_rank_is_refused(tokens: str) -> None:
    from accelerate import Accelerator

    from shardstream.client import ShardstreamLoader, StreamingDataset, Topology
    from shardstream.integrations.hf_accelerate import prepare_loader

    dataset = StreamingDataset(tokens, 4, topology=Topology(rank=1, world_size=2))
    with pytest.raises(ConfigError, match="reads as rank 1 of 2 but accelerate runs"):
        prepare_loader(Accelerator(cpu=True), ShardstreamLoader(dataset, num_workers=0))
