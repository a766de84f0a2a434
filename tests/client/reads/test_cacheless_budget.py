"""Cacheless reads against the memory budget: bytes fetched stay bounded.

A budget that cannot hold what the mixing window needs used to thrash: blocks were
evicted before their last use and fetched again (32x the dataset in a benchmark). Now the
stream checks the budget against the plan's need at start (a :class:`ConfigError` naming
``memory_budget_bytes`` and the bytes needed), evicts blocks of shards the plan is done
with first, and never evicts blocks wanted by batches still to be built. Bytes are
counted by the emulator (what the store served) and by the reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream.client import PlanOptions, ReadOptions, StreamingDataset
from shardstream.errors import ConfigError
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.ranged_shards import (
    N,
    read_ids,
    through_emulator,
    upload_folder,
    write_ranged_shards,
)
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]


@pytest.fixture
def dataset(s3_bucket: S3Bucket, tmp_path: Path) -> tuple[str, int]:
    write_ranged_shards(tmp_path / "ds")
    total = upload_folder(tmp_path / "ds", f"{s3_bucket.url}/budget")
    return f"{s3_bucket.url}/budget/index.json", total


def _need(url: str, plan: PlanOptions | None = None) -> int:
    """The bytes the plan's window needs, as the stream computes them."""
    plan = plan or PlanOptions(seed=3)
    ds = StreamingDataset(url, 8, read=ReadOptions(memory_only=True), plan=plan)
    try:
        return ds.stream.memory_need(0, 0)
    finally:
        ds.stream.close()


def test_budget_below_the_window_need_is_refused_before_any_block(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    need = _need(url)
    assert 0 < need <= total
    cloud_emulator.reset()
    with pytest.raises(ConfigError, match=rf"memory_budget_bytes.*{need}"):
        read_ids(url, read=ReadOptions(memory_only=True, memory_budget_bytes=need // 2))
    # Refused up front: no sample block was fetched (at most the index and headers).
    assert cloud_emulator.stats()["body_bytes"] < total / 4


def test_budget_just_above_the_need_fetches_each_byte_about_once(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    need = _need(url)
    cloud_emulator.reset()
    ids, stats = read_ids(url, read=ReadOptions(memory_only=True, memory_budget_bytes=need))
    assert sorted(ids) == list(range(N))
    assert total <= stats.bytes_fetched <= 1.05 * total
    assert cloud_emulator.stats()["body_bytes"] <= 1.05 * total + (64 << 10)  # + the index


def test_narrow_window_within_budget_frees_finished_shards(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A window of about one shard: the budget holds a few shards, not the dataset, so the
    blocks of shards the plan is done with must go first, and nothing twice."""
    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    plan = PlanOptions(seed=3, num_partitions=1, window=400)
    need = _need(url, plan)
    assert need < total * 0.8  # the budget below cannot hold the whole dataset
    cloud_emulator.reset()
    ds = StreamingDataset(
        url, 8, read=ReadOptions(memory_only=True, memory_budget_bytes=need), plan=plan
    )
    ids = [i for batch in ds for i in batch["id"].tolist()]
    stats = ds.stream.read_stats
    assert sorted(ids) == list(range(N))
    assert total <= stats.bytes_fetched <= 1.05 * total
    assert stats.bytes_evicted > 0  # finished shards were freed to stay within the budget
    assert cloud_emulator.stats()["body_bytes"] <= 1.05 * total + (64 << 10)


def test_two_workers_each_fetch_the_dataset_at_most_once(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DataLoader workers are separate processes with a budget each: the node fetches at
    most once per process (they cannot share memory), never more."""
    from torch.utils.data import DataLoader

    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    need = _need(url)
    cloud_emulator.reset()
    ds = StreamingDataset(
        url,
        8,
        read=ReadOptions(memory_only=True, memory_budget_bytes=need),
        plan=PlanOptions(seed=3),
    )
    ids = [i for batch in DataLoader(ds, batch_size=None, num_workers=2) for i in batch["id"]]
    assert sorted(int(i) for i in ids) == list(range(N))
    assert cloud_emulator.stats()["body_bytes"] <= 2 * 1.05 * total + (64 << 10)
