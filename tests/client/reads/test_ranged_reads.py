"""Block-granular reads: the same batches whole, ranged through the cache, and cacheless.

Everything goes through the cloud emulator (latency, per-connection bandwidth, per-prefix
request limits, injected faults) in front of moto. The sequence of sample ids must be
identical in every mode, with and without faults; a corrupted block must be detected by
its digest and fetched again; a first batch must arrive with a small part of the shards
fetched.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from shardstream.client import CacheOptions, PlanOptions, ReadOptions, StreamingDataset
from shardstream.client.distributed import Topology
from shardstream.client.reads.ranges import blocks_of_samples, coalesce, offsets_from_index
from shardstream.errors import HashMismatchError
from shardstream.mds import MDSIndex, MDSWriter, blocks_of_spans, load_index, write_shard_arrays
from shardstream.storage import open_store
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
    total = upload_folder(tmp_path / "ds", f"{s3_bucket.url}/ranged")
    return f"{s3_bucket.url}/ranged/index.json", total


def _num_shards(url: str) -> int:
    folder, _, name = url.rpartition("/")
    return len(load_index(open_store(folder).read_bytes(name)).shards)


def test_blocks_of_spans_and_coalesce() -> None:
    offsets = np.array([0, 10, 20, 40, 41, 100], dtype=np.int64)
    assert blocks_of_samples(offsets, [0], 8).tolist() == [0, 1]
    assert blocks_of_samples(offsets, [2, 3], 8).tolist() == [2, 3, 4, 5]
    assert blocks_of_spans(np.array([5]), np.array([5]), 8).tolist() == []
    assert coalesce(np.array([1, 2, 3, 4, 9]), 3) == [(1, 3), (4, 4), (9, 9)]
    assert coalesce(np.array([], dtype=np.int64), 3) == []


def test_fixed_size_samples_are_located_from_the_index_alone(tmp_path: Path) -> None:
    """A first batch requests its blocks before the headers arrive where the index fixes
    the layout: the offsets it implies are the header's, and variable-size columns (or a
    layout that does not end at the file's size) give none."""
    from shardstream.mds import ShardReader

    fixed = {"tokens": "ndarray:uint16:64", "id": "int64"}
    with MDSWriter(tmp_path / "fixed", fixed, block_size=4096, size_limit=20_000) as w:
        for i in range(300):
            w.write({"tokens": np.full(64, i, np.uint16), "id": i})
    shards = load_index(tmp_path / "fixed" / "index.json").shards
    assert len(shards) > 1
    for shard in shards:
        reader = ShardReader(tmp_path / "fixed" / shard.raw_data.basename, shard)
        assert np.array_equal(offsets_from_index(shard), reader.offsets)
    with MDSWriter(tmp_path / "var", {"text": "str"}, block_size=4096) as w:
        for i in range(50):
            w.write({"text": "x" * i})
    assert offsets_from_index(load_index(tmp_path / "var" / "index.json").shards[0]) is None
    shard = shards[0]
    grown = dataclasses.replace(
        shard, raw_data=dataclasses.replace(shard.raw_data, bytes=shard.raw_data.bytes + 1)
    )
    assert offsets_from_index(grown) is None


def test_same_sequence_whole_ranged_and_cacheless_with_faults(
    dataset: tuple[str, int],
    cloud_emulator: CloudEmulator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = dataset
    through_emulator(cloud_emulator, monkeypatch)
    whole, _ = read_ids(
        url, CacheOptions(dir=tmp_path / "c0"), read=ReadOptions(ranged_reads=False)
    )
    assert sorted(whole) == list(range(N))
    faults = {"cut_rate": 0.05, "error_rate": 0.05, "corrupt_rate": 0.03}
    clean = dict.fromkeys(faults, 0.0)

    def faulty() -> None:  # once the index is read: index.json has no digest to check
        cloud_emulator.configure(latency_s=0.005, faults=faults)

    ranged, rstats = read_ids(url, CacheOptions(dir=tmp_path / "c1"), opened=faulty)
    cloud_emulator.configure(faults=clean)
    cacheless, mstats = read_ids(
        url, read=ReadOptions(memory_only=True, memory_budget_bytes=8 << 20), opened=faulty
    )
    cloud_emulator.configure(faults=clean)  # _num_shards reads index.json, which has no digest
    assert ranged == whole
    assert cacheless == whole
    assert rstats.requests > 0 and mstats.requests > 0  # really read by range
    assert not (tmp_path / "c2").exists()
    # Every shard landed in the cache whole and verified (the background fill).
    cached = list((tmp_path / "c1" / "data").glob("*shard.*.mds"))
    assert len(cached) == _num_shards(url)


def test_corrupt_block_is_detected_and_fetched_again(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = dataset
    through_emulator(cloud_emulator, monkeypatch)
    # Every shard body is corrupted until two have been: each range gets three attempts, so
    # the read must recover whatever ranges the two flips land in. (index.json has no
    # digest to check it against: the corruption starts once it is read.)
    cloud_emulator.configure(latency_s=0.0)
    ids, stats = read_ids(
        url,
        read=ReadOptions(memory_only=True),
        opened=lambda: cloud_emulator.configure(faults={"corrupt_rate": 1.0, "corrupt_max": 2}),
    )
    assert sorted(ids) == list(range(N))  # and every row's tokens checked in read_ids
    assert stats.corrupt_blocks == 2
    assert cloud_emulator.stats()["corrupted"] == 2


def test_cacheless_fetches_each_byte_about_once(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    ids, stats = read_ids(url, read=ReadOptions(memory_only=True, memory_budget_bytes=64 << 20))
    assert sorted(ids) == list(range(N))
    assert stats.bytes_evicted == 0
    assert total <= stats.bytes_fetched <= 1.05 * total


def test_first_batch_before_whole_shards(
    dataset: tuple[str, int], cloud_emulator: CloudEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, total = dataset
    through_emulator(cloud_emulator, monkeypatch)
    ds = StreamingDataset(url, 8, read=ReadOptions(memory_only=True), plan=PlanOptions(seed=3))
    first = next(iter(ds))
    fetched = ds.stream.read_stats.bytes_fetched
    ds.stream.close()
    assert len(first["id"]) == 8
    # Headers and the blocks of the look-ahead batches only, not the mixing window's shards.
    assert fetched < total / 2


def test_zstd_shards_are_read_whole_in_memory(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_ranged_shards(tmp_path / "z", compression="zstd")
    upload_folder(tmp_path / "z", f"{s3_bucket.url}/z")
    through_emulator(cloud_emulator, monkeypatch)
    url = f"{s3_bucket.url}/z/index.json"
    ids, stats = read_ids(url, read=ReadOptions(memory_only=True, memory_budget_bytes=8 << 20))
    assert sorted(ids) == list(range(N))
    assert stats.requests == _num_shards(url)  # one whole read per shard


def test_shards_without_digests_follow_the_option(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_ranged_shards(tmp_path / "n", block_size=None)
    upload_folder(tmp_path / "n", f"{s3_bucket.url}/n")
    through_emulator(cloud_emulator, monkeypatch)
    url = f"{s3_bucket.url}/n/index.json"
    whole, wstats = read_ids(url, CacheOptions(dir=tmp_path / "c"))
    assert sorted(whole) == list(range(N)) and wstats.requests == 0  # fetched whole
    later, lstats = read_ids(
        url,
        CacheOptions(dir=tmp_path / "d"),
        read=ReadOptions(unverified_blocks="verify_on_completion"),
    )
    assert later == whole and lstats.requests > 0
    from shardstream.errors import ConfigError

    with pytest.raises(ConfigError, match="no per-block digests"):
        read_ids(url, read=ReadOptions(memory_only=True, unverified_blocks="refuse"))


def test_a_shard_opens_with_its_header_bytes_not_a_block(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a shard by block 0 would fetch 64 KiB for a 2 KiB header.
    write_ranged_shards(tmp_path / "h", block_size=64 << 10)
    url = f"{s3_bucket.url}/h/index.json"
    total = upload_folder(tmp_path / "h", url.rpartition("/")[0])
    shards = load_index(tmp_path / "h" / "index.json").shards
    heads = sum(s.header_digest.length for s in shards if s.header_digest is not None)
    ds = StreamingDataset(url, 8, read=ReadOptions(memory_only=True), plan=PlanOptions(seed=3))
    fills = ds.stream.reads().fills
    for shard in range(len(shards)):
        fills.partial(shard).reader()  # opens the shard: its header only
    assert ds.stream.read_stats.bytes_fetched == heads < total / 20
    # A header that does not match its digest is refused, naming the header.
    index = json.loads((tmp_path / "h" / "index.json").read_text())
    for entry in index["shards"]:
        hashes = entry["raw_data"]["hashes"]
        key = next(k for k in hashes if k.startswith("header:"))
        hashes[key] = "0" * 16
    open_store(url.rpartition("/")[0]).write_bytes("index.json", json.dumps(index).encode())
    bad = StreamingDataset(url, 8, read=ReadOptions(memory_only=True), plan=PlanOptions(seed=3))
    with pytest.raises(HashMismatchError, match=r"header \(bytes 0-"):
        next(iter(bad))
    ds.stream.close()
    bad.stream.close()


def test_nodes_fill_only_the_shards_they_read_most_of(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 shards of 151 samples of one 4 KiB block each; 4 ranks of batch 8 drop a 16-sample
    # tail, so partition boundaries fall a few samples inside shards: each rank reads ~4
    # shards whole and a few samples of its neighbours' shards, which it must read by
    # block, not fill (fetch) whole.
    folder, tokens = tmp_path / "nodes", 2048 - 8
    columns = {"id": "int64", "tokens": f"ndarray:uint16:{tokens}"}
    shards = []
    for k in range(16):
        ids = np.arange(k * 151, (k + 1) * 151)
        rows = np.repeat(ids[:, None], tokens, axis=1).astype(np.uint16)
        arrays = {"id": ids, "tokens": rows}
        name = f"shard.{k:05d}.mds"
        shards.append(write_shard_arrays(folder, name, columns, arrays, block_size=4096))
    MDSIndex(shards=shards).write(folder / "index.json")
    total = upload_folder(folder, f"{s3_bucket.url}/nodes")
    url = f"{s3_bucket.url}/nodes/index.json"
    through_emulator(cloud_emulator, monkeypatch)
    cloud_emulator.reset()
    seen: list[int] = []
    sparse = 0
    for rank in range(4):
        ds = StreamingDataset(
            url,
            8,
            cache=CacheOptions(dir=tmp_path / f"node{rank}"),
            plan=PlanOptions(seed=3),
            topology=Topology(rank=rank, world_size=4),
        )
        _, share = ds.stream.plan(0).rank_shard_shares(rank, 4)
        sparse += int(np.count_nonzero(share < 0.2))
        for batch in ds:
            assert batch["tokens"][:, 0].tolist() == [i % 65536 for i in batch["id"].tolist()]
            seen += batch["id"].tolist()
        ds.stream.close(finish_fills_s=30)
    assert sparse >= 3  # the boundaries do fall inside shards
    assert len(seen) == len(set(seen)) == 16 * 151 - 16
    # Shard bytes served (every rank reads the index): filling every touched shard would
    # fetch (16 + sparse) / 16 of the dataset.
    served = cloud_emulator.stats()["body_bytes"] - 4 * (folder / "index.json").stat().st_size
    assert served <= 1.05 * total, (served, total)
