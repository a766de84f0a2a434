"""Digests for a fast cold start, computed for MDS shards someone else wrote.

Shards written by MosaicML's ``MDSWriter`` carry no per-block, header or piece digests, so
a reader can verify nothing smaller than a whole shard and must fetch shards whole before
its first batch (seconds for 64 MB shards on S3). ``shardstream register`` reads each
shard once, in order, and records in the shard's index entry (``raw_data.hashes``, the
one map MosaicML's reader leaves open; the shard files are never rewritten):

* ``xxh3_64`` of the whole file, where the index records no hash the client computes;
* the block digests (``blocks:xxh3_64:<block size>``), so blocks are checked on arrival;
* the header digest (``header:xxh3_64:<length>``), so a shard opens with its header alone;
* the piece table (``piecetable:xxh3_64:<piece size>``, ``shardstream.mds.index_table_entry``), so a
  first batch reads its samples' pieces: in the index, because the header cannot hold it.

A hash the index already records is checked against the bytes read: digests of a shard
that does not match its index are never registered.
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from shardstream.errors import CorruptShardError
from shardstream.hashing import SUPPORTED_HASHES, new_hasher

if TYPE_CHECKING:
    from shardstream.mds import MDSIndex, ShardInfo
    from shardstream.storage import ObjectStore

__all__ = ["READ_BYTES", "shard_digests", "with_fast_start"]

log = logging.getLogger("shardstream.shard_builder.fast_start")

READ_BYTES = 16 << 20
"""Bytes per ranged read of a shard being digested (several round trips of transfer)."""


def with_fast_start(
    store: ObjectStore,
    index: MDSIndex,
    *,
    block_size: int | None = None,
    piece_size: int | None = None,
    threads: int = 8,
) -> MDSIndex:
    """``index`` with the fast-start digests of every uncompressed shard that lacks them
    (each read once from ``store``, ``threads`` shards at a time). ``block_size`` (default
    4 MiB, as the builder's) and the smallest ``piece_size`` (default 64 KiB) are bytes."""
    from shardstream.mds import (
        DEFAULT_BLOCK_SIZE,
        DEFAULT_PIECE_SIZE,
        check_block_size,
        check_piece_size,
    )

    block = check_block_size(block_size) or DEFAULT_BLOCK_SIZE
    piece = check_piece_size(piece_size) or DEFAULT_PIECE_SIZE
    todo = [i for i, shard in enumerate(index.shards) if _lacks_digests(shard)]
    if not todo:
        return index
    shards = list(index.shards)
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="shardstream-digest") as pool:
        found = pool.map(lambda i: shard_digests(store, shards[i], block, piece), todo)
        for i, hashes in zip(todo, found, strict=True):
            raw = dataclasses.replace(shards[i].raw_data, hashes=hashes)
            shards[i] = dataclasses.replace(shards[i], raw_data=raw)
    log.info("computed fast-start digests of %d of %d shards", len(todo), len(shards))
    return dataclasses.replace(index, shards=shards)


def _lacks_digests(shard: ShardInfo) -> bool:
    if shard.compression is not None:
        return False  # a zstd frame is read whole anyway
    return shard.block_digests is None or shard.header_digest is None or shard.piece_spec is None


def shard_digests(
    store: ObjectStore, shard: ShardInfo, block_size: int, min_piece_size: int
) -> dict[str, str]:
    """``shard``'s ``raw_data.hashes`` with the fast-start digests added, from one
    sequential read of the stored file; :class:`CorruptShardError` if the bytes differ
    from a hash the index records."""
    from shardstream.mds import (
        BLOCK_DIGEST_ALGO,
        PIECE_ALGO,
        BlockHasher,
        HeaderHasher,
        digests_key,
        index_piece_size,
        index_table_entry,
        is_digests_key,
    )

    raw = shard.raw_data
    name, size = raw.basename, raw.bytes
    known = {algo: raw.hashes[algo] for algo in SUPPORTED_HASHES if algo in raw.hashes}
    whole = {algo: new_hasher(algo) for algo in {*known, "xxh3_64"}}
    blocks, head = BlockHasher(BLOCK_DIGEST_ALGO, block_size), HeaderHasher()
    pieces: BlockHasher | None = None
    data_start, piece_size = 0, 0
    for start in range(0, size, READ_BYTES):
        data = store.read_range(name, start, min(start + READ_BYTES, size), expected_size=size)
        view = memoryview(data)
        for hasher in whole.values():
            hasher.update(view)
        blocks.update(view)
        head.update(view)
        if pieces is None and len(view) >= 8:  # bytes 4-8: offsets[0], where samples start
            data_start = int.from_bytes(bytes(view[4:8]), "little")
            if not 8 <= data_start <= size:
                raise CorruptShardError(
                    f"shard {name}: header says samples start at byte {data_start} of a "
                    f"{size}-byte file; the shard is corrupt or not MDS"
                )
            piece_size = min(index_piece_size(size - data_start, min_piece_size), block_size)
            pieces = BlockHasher(PIECE_ALGO, piece_size)
        if pieces is not None:
            skip = max(0, data_start - start)
            pieces.update(view[skip:])
    for algo, expected in known.items():
        actual = whole[algo].hexdigest()
        if actual != expected:
            raise CorruptShardError(
                f"shard {name}: {algo} of the stored file is {actual}, the index records "
                f"{expected}; the shard does not match its index, so it was not registered"
            )
    header = head.finish()
    if header is None or pieces is None:
        raise CorruptShardError(f"shard {name}: the file ends inside its header")
    hashes = {k: v for k, v in raw.hashes.items() if not is_digests_key(k)}  # all anew
    hashes.setdefault("xxh3_64", whole["xxh3_64"].hexdigest())
    hashes[digests_key(BLOCK_DIGEST_ALGO, block_size)] = blocks.finish().hex
    hashes[header[0]] = header[1]
    key, table = index_table_entry(pieces.finish().hex, piece_size)
    hashes[key] = table
    return hashes
