"""SIGKILL mid-epoch and exact resume while reading by range through the cloud emulator.

Two ranks x two DataLoader workers read a dataset with small digest blocks (and piece
tables, so each process's first batch is read by piece) through the
emulator (latency, per-connection bandwidth, cut bodies and 503s injected), in the
cacheless mode and in the ranged cache mode. The job is SIGKILLed mid-epoch and resumed
from its per-rank ``state_dict``: every rank's consumed sequence must equal the
uninterrupted run's, and the uninterrupted run must equal the whole-shard reader's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardstream.mds import MDSWriter
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.ranged_shards import upload_folder
from tests.fixtures.s3 import S3Bucket
from tests.harness.compare import check_reference, check_same_world_resume
from tests.harness.config import DataSettings, TrainerConfig
from tests.harness.datasets import COLUMNS, expected_tokens
from tests.harness.scenario import attempt, resume_state_dict, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

N = 6400
GLOBAL_BATCH = 32
STEPS = N // GLOBAL_BATCH
KILL_AT = 30
CKPT_EVERY = 10


def write_ranged_shards(out: Path) -> None:
    """The harness's id dataset, in shards of ~10 KB with 8 KiB digest blocks and 4 KiB
    pieces, so that every shard is read in several ranged requests and every fresh process
    (each worker, each resumed attempt) reads its first batch by piece."""
    tokens = expected_tokens(np.arange(N, dtype=np.int64))
    with MDSWriter(out, COLUMNS, size_limit=10_000, block_size=8192, piece_size=4096) as writer:
        for i in range(N):
            writer.write({"id": i, "tokens": tokens[i]})


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        {"memory_only": True, "memory_budget_bytes": 16 << 20},
        {"ranged_reads": True},
    ],
    ids=["cacheless", "ranged-cache"],
)
def test_sigkill_mid_epoch_resumes_exactly(
    extra: dict[str, object],
    s3_bucket: S3Bucket,
    cloud_emulator: CloudEmulator,
    tmp_path: Path,
) -> None:
    write_ranged_shards(tmp_path / "ds")
    upload_folder(tmp_path / "ds", f"{s3_bucket.url}/resume")
    env = {"AWS_ENDPOINT_URL": cloud_emulator.endpoint_url}
    base = TrainerConfig(
        attempt_dir=str(tmp_path / "whole"),
        data=DataSettings(
            source=f"{s3_bucket.url}/resume/index.json",
            global_batch_size=GLOBAL_BATCH,
            num_partitions=4,
            seed=5,
            cache_dir=str(tmp_path / "cache-whole"),
            read_extra={"ranged_reads": False},
        ),
        num_workers=2,
        checkpoint_every=CKPT_EVERY,
        step_sleep_s=0.02,
    )
    whole = run_epoch(attempt(base, "whole", step_sleep_s=0.0), 2, env=env)
    assert check_reference(whole, GLOBAL_BATCH) == STEPS

    cloud_emulator.configure(latency_s=0.005, faults={"cut_rate": 0.02, "error_rate": 0.02})
    data = DataSettings(
        source=base.data.source,
        global_batch_size=GLOBAL_BATCH,
        num_partitions=4,
        seed=5,
        cache_dir=str(tmp_path / "cache-ranged"),
        read_extra=extra,
    )
    ref = run_epoch(attempt(base, "ref", data=data, step_sleep_s=0.0), 2, env=env)
    for step in range(1, STEPS + 1):
        assert np.array_equal(ref.global_batch(step), whole.global_batch(step)), step

    killed_cfg = attempt(base, "killed", data=data)
    killed = run_and_kill(killed_cfg, 2, kill_at_step=KILL_AT, env=env)
    resume = resume_state_dict(killed_cfg, killed)
    resumed = run_epoch(attempt(base, "resumed", data=data, resume_state_dict=resume), 2, env=env)
    report = check_same_world_resume(ref, killed.log, resumed, killed.checkpoint_step, GLOBAL_BATCH)
    assert report.checkpoint_step >= CKPT_EVERY
    assert cloud_emulator.stats()["cuts"] + cloud_emulator.stats()["errors"] > 0
