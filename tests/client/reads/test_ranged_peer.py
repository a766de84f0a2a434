"""Cache mode: a process reading blocks of a shard another process is downloading takes
the blocks already in that download file (verified against their digests) instead of
fetching them again; holes, half-written or flipped blocks are fetched from the store."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from shardstream.client.reads.block_sources import NodeSharing
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.queue import RangeQueue
from shardstream.mds import ShardInfo, ShardReader, load_index
from shardstream.storage import ObjectStore, open_store
from tests.fixtures.ranged_shards import BLOCK, upload_folder, write_ranged_shards
from tests.fixtures.s3 import S3Bucket


def test_blocks_in_a_peer_download_are_not_fetched_again(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    store, info, full = _uploaded(s3_bucket, tmp_path, "peer")
    blocks = -(-len(full) // BLOCK)
    assert blocks >= 8
    # The peer has the first half of the blocks, one of them flipped; the rest is a hole.
    half = blocks // 2
    image = bytearray(len(full))
    image[: half * BLOCK] = full[: half * BLOCK]
    image[BLOCK + 5] ^= 0xFF
    peer = tmp_path / "tmp" / "peer.mds"
    peer.parent.mkdir()
    peer.write_bytes(bytes(image))

    stats = BlockStats()
    queue = RangeQueue(4, None)
    fd = os.memfd_create("peer-test", os.MFD_CLOEXEC)
    sharing = NodeSharing(
        peers=lambda: [tmp_path / "tmp" / "gone.mds", peer],
        offer_to=lambda: [peer],  # a download file: what this process fetches goes in
    )
    partial = _partial(store, info, fd, Path(f"/proc/self/fd/{fd}"), queue, stats, sharing, 1)
    try:
        partial.wait(np.arange(partial.num_blocks, dtype=np.int64))
        assert os.pread(fd, len(full) + 1, 0) == full
    finally:
        partial.close()
        queue.close()
    assert stats.peer_bytes == (half - 1) * BLOCK  # the flipped block was fetched
    assert stats.bytes_fetched == len(full) - stats.peer_bytes
    assert stats.corrupt_blocks == 0  # a peer's unfinished block is not a corrupt store
    # What this process fetched went into the peer's download file too (its fill takes it
    # from there instead of fetching it again): the peer now holds the whole shard.
    assert peer.read_bytes() == full


def test_a_fill_takes_blocks_other_processes_wrote_into_its_file(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    store, info, full = _uploaded(s3_bucket, tmp_path, "helped")
    blocks = -(-len(full) // BLOCK)
    target = tmp_path / "download.mds"
    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    stats, queue = BlockStats(), RangeQueue(4, None)
    partial = _partial(store, info, fd, target, queue, stats, NodeSharing(node_shared=True), 2)
    # Another process wrote blocks 1-3 (verified) into this file; block 5 is garbage.
    with open(target, "r+b") as other:
        other.seek(BLOCK)
        other.write(full[BLOCK : 4 * BLOCK])
        other.seek(5 * BLOCK)
        other.write(b"\x01" * BLOCK)
    try:
        partial.wait(np.arange(blocks, dtype=np.int64))
        assert target.read_bytes() == full
    finally:
        partial.close()
        queue.close()
    assert stats.peer_bytes >= 2 * BLOCK  # at least one whole run of two came from the file
    assert stats.bytes_fetched == len(full) - stats.peer_bytes


def test_a_reader_joins_another_process_s_download_file_in_place(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """Cache mode: a process that needs a shard another process is filling opens that
    download file itself (``MemoryShards.join``): the blocks the filler wrote are used
    where they lie (not copied into a memory file of its own), the ones it fetches go into
    the same file, nothing is ever freed there, and once the filler publishes the file
    (a rename) the joined reader goes on reading the same bytes."""
    from shardstream.client.reads.memory import MemoryShards

    store, info, full = _uploaded(s3_bucket, tmp_path, "joined")
    key = info.raw_data.basename
    blocks = -(-len(full) // BLOCK)
    download = tmp_path / "tmp" / key
    download.parent.mkdir()
    queue = RangeQueue(4, None)
    filler_fd = os.open(download, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    shared = NodeSharing(node_shared=True)
    filler = _partial(store, info, filler_fd, download, queue, BlockStats(), shared, 2)
    stats = BlockStats()
    memory = MemoryShards(queue=queue, budget_bytes=1 << 30, range_bytes=2 * BLOCK, stats=stats)
    try:
        half = blocks // 2
        filler.wait(np.arange(half, dtype=np.int64))  # the filler's first half is in
        joined = memory.join(0, info, key, store, node_key="k", download=download)
        again = memory.join(0, info, key, store, node_key="k", download=download)
        assert joined is not None and again is joined
        assert os.fstat(joined.fd).st_ino == os.stat(download).st_ino  # the same file
        joined.reader()  # its header: the filler's, checked against its digest
        assert stats.bytes_fetched == 0 and stats.requests == 0
        joined.wait(np.arange(blocks, dtype=np.int64))
        assert stats.peer_bytes == half * BLOCK  # used in place...
        assert stats.bytes_fetched == len(full) - half * BLOCK  # ...the rest fetched once
        assert download.read_bytes() == full  # into the filler's file
        assert joined.evict(np.arange(blocks, dtype=np.int64)) == 0  # never freed there
        published = tmp_path / "data" / key
        published.parent.mkdir()
        download.rename(published)  # the filler publishes it
        reader, original = joined.reader(), ShardReader(tmp_path / "ds" / key)
        assert len(reader) == len(original) > 1
        for i in (0, len(reader) - 1):
            assert repr(reader[i]) == repr(original[i])
        assert memory.join(1, info, key, store, node_key="k", download=download) is None  # gone
    finally:
        memory.close()
        filler.close()
        queue.close()


def _partial(
    store: ObjectStore,
    info: ShardInfo,
    fd: int,
    path: Path,
    queue: RangeQueue,
    stats: BlockStats,
    sharing: NodeSharing,
    range_blocks: int,
) -> PartialShard:
    """A partial shard of ``info`` in the file ``fd`` (at ``path``), in BLOCK blocks."""
    return PartialShard(
        info=info,
        key=info.raw_data.basename,
        store=store,
        fd=fd,
        path=path,
        queue=queue,
        block_size=BLOCK,
        range_blocks=range_blocks,
        stats=stats,
        sharing=sharing,
    )


def _uploaded(
    s3_bucket: S3Bucket, tmp_path: Path, name: str
) -> tuple[ObjectStore, ShardInfo, bytes]:
    """A dataset written under ``tmp_path/ds`` and uploaded as ``name``: its store, its
    first shard's index entry and that shard's bytes."""
    write_ranged_shards(tmp_path / "ds")
    upload_folder(tmp_path / "ds", f"{s3_bucket.url}/{name}")
    store = open_store(f"{s3_bucket.url}/{name}")
    info = load_index(store.read_bytes("index.json")).shards[0]
    return store, info, (tmp_path / "ds" / info.raw_data.basename).read_bytes()
