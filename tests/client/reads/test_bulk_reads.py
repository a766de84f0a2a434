"""Bulk reads: after a cold first batch (by piece), a shard's bulk comes in long ranges.

A batch of random samples touches one block here and one there, and each block read alone
paid a round trip: with the look-ahead at one block per request, an epoch cost about a
request per block. The process that fills a shard into the cache fetches every block of it
anyway, so its look-ahead and fill reads now run on over the missing blocks after the
ones a batch needs, to a length of several round trips of transfer at the link it measured
(``client/reads/link.py``). Counted by the cloud emulator in front of the session's moto server.
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
from shardstream.client.reads.link import BULK_RTTS, LinkEstimate
from shardstream.client.reads.ranges import lengthen
from shardstream.mds import MDSWriter, load_index
from shardstream.storage import open_store
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

N = 8 * 2000
TOKENS = 256  # 512-byte rows + an 8-byte id: 8 shards of 1 MiB, 16 blocks of 64 KiB each
BLOCK = 64 << 10


def tokens_of(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(TOKENS, dtype=np.int64) * 5 + i * 3).astype(np.uint16)


@pytest.fixture
def dataset(s3_bucket: S3Bucket, tmp_path: Path) -> tuple[str, int, int, int]:
    """``(index URL, shards, blocks over all shards, their bytes)``."""
    out = tmp_path / "bulk"
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(
        out, columns, size_limit=1 << 20, block_size=BLOCK, piece_size=4 << 10
    ) as writer:
        for i in range(N):
            writer.write({"id": i, "tokens": tokens_of(i)})
    store = open_store(f"{s3_bucket.url}/bulk")
    for path in sorted(out.iterdir()):
        store.upload(path, path.name)
    shards = load_index(out / "index.json").shards
    blocks = sum(-(-s.raw_data.bytes // BLOCK) for s in shards)
    total = sum(s.raw_data.bytes for s in shards)
    return f"{s3_bucket.url}/bulk/index.json", len(shards), blocks, total


def test_lengthen_takes_the_free_blocks_after_each_run() -> None:
    free = np.array([False, True, True, True, False, True, True, True], dtype=bool)
    assert lengthen([(0, 0), (4, 4)], free, 3) == [(0, 2), (4, 6)]
    assert free.tolist() == [False, False, False, True, False, False, False, True]
    assert lengthen([(7, 7)], np.zeros(8, dtype=bool), 4) == [(7, 7)]  # nothing after it


def test_the_link_estimate_sizes_bulk_ranges_to_several_round_trips() -> None:
    link = LinkEstimate(rtt_s=0.5, bytes_per_s=1e6)  # a wrong guess, corrected by reads
    for _ in range(30):
        link.observe(64 << 10, 0.020)  # short reads: a round trip each
        link.observe(16 << 20, 0.020 + (16 << 20) / 90e6)
    assert link.rtt_s == pytest.approx(0.020, rel=0.01)
    assert link.bytes_per_s == pytest.approx(90e6, rel=0.01)
    wanted = BULK_RTTS * 0.020 * 90e6
    assert link.bulk_bytes(1 << 20, 64 << 20) == pytest.approx(wanted, rel=0.02)
    assert link.bulk_bytes(32 << 20, 64 << 20) == 32 << 20  # at least the floor
    assert link.bulk_bytes(1 << 20, 4 << 20) == 4 << 20  # at most the ceiling


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_reads_each_shard_in_a_few_long_ranges(
    dataset: tuple[str, int, int, int],
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    workers: int,
) -> None:
    url, shards, blocks, total = dataset
    assert shards == 8 and blocks >= 8 * 15
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    # Ranges of at most one block unless lengthened: 64 KiB at the emulator's 20 ms and
    # 90 MB/s per connection is a round trip for 0.7 ms of transfer.
    cache, read = CacheOptions(dir=tmp_path / "cache"), ReadOptions(range_bytes=BLOCK)
    ds = StreamingDataset(url, 32, cache=cache, read=read, plan=PlanOptions(seed=2))
    loader = ShardstreamLoader(ds, num_workers=workers)
    ids: list[int] = []
    for batch in loader:
        ids += batch["id"].tolist()
        for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
            assert row.numpy().tolist() == tokens_of(i).tolist()
    loader.close()
    assert sorted(ids) == list(range(N))
    gets = [e for e in cloud_emulator.log() if str(e["path"]).endswith(".mds")]
    heads = {s.raw_data.basename: s.header_digest for s in load_index(index_of(url)).shards}
    # Block reads start at a block's first byte; headers too (a first batch's pieces start
    # past the header, at odd offsets here), and are as long as the header.
    blocks_read = [
        e
        for e in gets
        if _start(e) % BLOCK == 0 and e["sent"] != heads[e["path"].rsplit("/", 1)[1]].length
    ]
    # A few long ranges a shard; by block it was about one GET a block (16 a shard).
    assert len(blocks_read) <= 3 * shards, [(e["path"], e["range"]) for e in blocks_read]
    assert sum(int(e["sent"]) for e in gets) <= 1.15 * total  # and not more bytes


def _start(entry: dict[str, Any]) -> int:
    return int(str(entry["range"]).removeprefix("bytes=").split("-")[0])


def index_of(url: str) -> bytes:
    folder, _, name = url.rpartition("/")
    return open_store(folder).read_bytes(name)
