"""Small shards: a shard no larger than one block is read once, in one request.

A ranged read of a 128 KiB shard fetched its header, then a piece, then its header again
and the whole shard (and sometimes the whole shard once more in another worker): about
1.8x its bytes in four or five round trips. Such a shard is now fetched whole, once per
node. Counted by the cloud emulator in front of the session's moto server: every GET and
every body byte it served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.client import (
    CacheOptions,
    PlanOptions,
    ReadOptions,
    ShardstreamLoader,
    StreamingDataset,
)
from shardstream.mds import MDSWriter
from shardstream.storage import open_store
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

N = 3600
TOKENS = 256  # 512-byte rows + an 8-byte id: 16 shards of ~128 KiB


def tokens_of(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(TOKENS, dtype=np.int64) * 3 + i * 7).astype(np.uint16)


@pytest.fixture
def small_shards(s3_bucket: S3Bucket, tmp_path: Path) -> tuple[str, int, int]:
    """16 shards of ~128 KiB with the writer's defaults (4 MiB blocks, 64 KiB pieces):
    ``(index URL, shards, their bytes)``."""
    out = tmp_path / "small"
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(out, columns, size_limit=128 << 10) as writer:
        for i in range(N):
            writer.write({"id": i, "tokens": tokens_of(i)})
    store = open_store(f"{s3_bucket.url}/small")
    shards = total = 0
    for path in sorted(out.iterdir()):
        store.upload(path, path.name)
        if path.suffix == ".mds":
            shards, total = shards + 1, total + path.stat().st_size
    return f"{s3_bucket.url}/small/index.json", shards, total


def _check(batch: dict[str, Any]) -> list[int]:
    ids: list[int] = batch["id"].tolist()
    for i, row in zip(ids, batch["tokens"], strict=True):
        assert row.numpy().tolist() == tokens_of(i).tolist()
    return ids


def _shard_gets(emu: CloudEmulator) -> list[dict[str, Any]]:
    return [e for e in emu.log() if str(e["path"]).endswith(".mds")]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_small_shard_is_fetched_once_in_one_request(
    small_shards: tuple[str, int, int],
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    workers: int,
) -> None:
    url, shards, total = small_shards
    assert 12 <= shards <= 20 and total < shards * (132 << 10)
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    cloud_emulator.configure(latency_s=0.002)
    ds = StreamingDataset(
        url, 16, cache=CacheOptions(dir=tmp_path / "cache"), plan=PlanOptions(seed=1)
    )
    ids: list[int] = []
    loader = ShardstreamLoader(ds, num_workers=workers)
    for batch in loader:
        ids += _check(batch)
    loader.close()
    assert sorted(ids) == list(range(N))
    gets = _shard_gets(cloud_emulator)
    per_shard: dict[str, int] = {}
    for entry in gets:
        per_shard[entry["path"]] = per_shard.get(entry["path"], 0) + 1
    assert len(per_shard) == shards
    assert max(per_shard.values()) == 1, per_shard  # one request a shard, node-wide
    assert sum(int(e["sent"]) for e in gets) == total  # each byte once


def test_a_small_shard_is_read_once_cacheless(
    small_shards: tuple[str, int, int],
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, shards, total = small_shards
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    cloud_emulator.configure(latency_s=0.002)
    read = ReadOptions(memory_only=True, memory_budget_bytes=64 << 20)
    ds = StreamingDataset(url, 16, read=read, plan=PlanOptions(seed=1))
    ids = [i for batch in ds for i in _check(batch)]
    assert sorted(ids) == list(range(N))
    gets = _shard_gets(cloud_emulator)
    assert len(gets) == shards
    assert sum(int(e["sent"]) for e in gets) == total
