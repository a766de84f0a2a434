"""The footprint the dataset computes is what its readers really hold at once.

``open_shards`` is a minimum: with small shards one chunk of batches reads many more, and
the old rule (ranks x workers x open_shards + prefetch) under-sizes the cache.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardstream.client import CacheOptions, PlanOptions, ReadOptions, StreamingDataset
from shardstream.client.batches.footprint import CacheFootprint
from tests.fixtures.datasets import ids_of, write_tokens

N = 2000


def make(tokens: Path, cache: Path, limit: int | None) -> StreamingDataset:
    options = CacheOptions(dir=cache, limit_bytes=limit, open_shards=1)
    read = ReadOptions(prefetch_shards=0)
    url = str(tokens / "index.json")
    return StreamingDataset(url, 4, cache=options, read=read, plan=PlanOptions(seed=3))


def over_limit_warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum("is over its limit" in r.getMessage() for r in caplog.records)


def test_the_footprint_counts_every_shard_a_chunk_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_tokens(tmp_path / "ds", N, size_limit=600)
    shard = max(p.stat().st_size for p in (tmp_path / "ds").glob("*.mds"))
    need = make(tmp_path / "ds", tmp_path / "probe", None).footprint()
    assert isinstance(need, CacheFootprint)
    assert need.shards_per_chunk > 1  # open_shards=1 is a minimum, not what is held
    assert need.shards_pinned > need.shards_per_chunk  # the last chunk's are still held
    assert need.shards_per_reader == need.shards_pinned  # prefetch_shards=0
    assert need.bytes_per_node <= need.shards_per_node * shard

    # The old rule (1 rank x 1 reader x open_shards + prefetch) is too small: the cache goes
    # over its limit, and the dataset says so before reading.
    with caplog.at_level(logging.WARNING):
        ids = [i for b in make(tmp_path / "ds", tmp_path / "old", shard) for i in ids_of(b)]
    assert sorted(ids) == list(range(N - N % 4))
    assert any("below what this job holds" in r.getMessage() for r in caplog.records)
    assert over_limit_warnings(caplog) == 1

    # The computed footprint is enough: no warning, never over the limit.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ds = make(tmp_path / "ds", tmp_path / "new", need.bytes_per_node)
        ids = [i for b in ds for i in ids_of(b)]
    assert sorted(ids) == list(range(N - N % 4))
    assert over_limit_warnings(caplog) == 0
    assert not any("below what this job holds" in r.getMessage() for r in caplog.records)


def test_workers_and_ranks_per_node_multiply_the_footprint(tmp_path: Path) -> None:
    from shardstream.client import Topology

    write_tokens(tmp_path / "ds", N, size_limit=600)
    url = str(tmp_path / "ds" / "index.json")
    options, read = CacheOptions(dir=tmp_path / "c", open_shards=2), ReadOptions(prefetch_shards=1)
    ds = StreamingDataset(url, 4, cache=options, read=read, topology=Topology(0, 4, 0, 2))
    one, four = ds.footprint(0), ds.footprint(4)
    assert one.ranks_per_node == 2 and one.readers_per_rank == 1
    assert one.shards_per_reader == one.shards_pinned + 1
    assert max(2, one.shards_per_chunk) <= one.shards_pinned <= 2 * max(2, one.shards_per_chunk)
    assert four.readers_per_rank == 4
    assert four.shards_per_node == min(four.shards_per_reader * 4 * 2, len(ds.resolved[0].shards))
