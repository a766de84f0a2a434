"""Which bytes of a shard a set of samples needs: pure functions over numpy arrays.

A shard file is cut into fixed-size *blocks* (the builder's per-block digest blocks when
the index records them, so every fetched byte can be verified on arrival; else
:data:`DEFAULT_BLOCK_BYTES`). Reads are planned in blocks: the samples of the next
batches map to the blocks that hold them, missing blocks are coalesced into runs of at
most a few MB (one ranged GET each), and a batch waits only for its own blocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.mds import ShardInfo, blocks_of_spans

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "block_size_of",
    "blocks_between",
    "blocks_of_samples",
    "coalesce",
    "header_bytes",
    "lengthen",
    "offsets_from_index",
]

I64 = npt.NDArray[np.int64]

DEFAULT_BLOCK_BYTES = 1 << 20
"""Fetch unit of shards whose index records no block digests (1 MiB)."""


def block_size_of(info: ShardInfo) -> int:
    """The block size reads of ``info`` use: its digest blocks, else the default."""
    digests = getattr(info, "block_digests", None)
    return int(digests.block_size) if digests is not None else DEFAULT_BLOCK_BYTES


def header_bytes(num_samples: int) -> int:
    """Bytes of an MDS shard's fixed header: the sample count and ``n + 1`` offsets.

    The config JSON that follows has no recorded length; it ends at ``offsets[0]``.
    """
    return 4 * (num_samples + 2)


def offsets_from_index(info: ShardInfo) -> I64 | None:
    """A shard's ``n + 1`` sample offsets from its index entry alone, or ``None``.

    Where every column has a fixed size and the index records the header's length (its
    header digest), sample ``i`` starts at ``header length + i * sample size``; that layout
    must also end exactly at the file's recorded size. A reader still uses the header's
    own offsets; these only let it request a batch's blocks before the header is here.
    """
    head = info.header_digest
    if head is None or any(size is None for size in info.column_sizes):
        return None
    step = sum(int(size or 0) for size in info.column_sizes)
    if head.length + info.samples * step != info.raw_data.bytes:
        return None
    return head.length + step * np.arange(info.samples + 1, dtype=np.int64)


def blocks_between(num_blocks: int, block_size: int, start: int, end: int) -> I64:
    """Blocks holding bytes ``[start, end)`` (at least the one holding ``start``), within
    the ``num_blocks`` blocks of a shard."""
    last = max(end - 1, start) // block_size
    return np.arange(start // block_size, min(last, num_blocks - 1) + 1)


def blocks_of_samples(offsets: I64, indices: npt.ArrayLike, block_size: int) -> I64:
    """Sorted unique blocks holding samples ``indices`` of a shard with sample ``offsets``
    (the ``n + 1`` byte offsets from its header)."""
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    return blocks_of_spans(offsets[idx], offsets[idx + 1], block_size)


def coalesce(blocks: I64, max_blocks: int) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` (inclusive) of consecutive ids in sorted ``blocks``, each at
    most ``max_blocks`` long: one ranged request per run.

    >>> coalesce(np.array([0, 1, 2, 5, 6, 9]), 2)
    [(0, 1), (2, 2), (5, 6), (9, 9)]
    """
    b: Any = np.asarray(blocks, dtype=np.int64)
    if b.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(b) != 1) + 1
    runs: list[tuple[int, int]] = []
    for run in np.split(b, cuts):
        first, last = int(run[0]), int(run[-1])
        while first <= last:
            stop = min(last, first + max_blocks - 1)
            runs.append((first, stop))
            first = stop + 1
    return runs


def lengthen(
    runs: list[tuple[int, int]], free: npt.NDArray[np.bool_], longest: int
) -> list[tuple[int, int]]:
    """``runs`` each extended forward over the consecutive ``free`` blocks after it, to at
    most ``longest`` blocks; the blocks taken are marked not free (in place).

    A bulk read: blocks a batch needs start a range that also brings the missing blocks
    after them, which the fill would fetch anyway, so a shard's bulk costs a few long
    requests instead of a round trip per block.

    >>> free = np.array([False, True, True, False, True])
    >>> lengthen([(0, 0), (3, 3)], free, 3), free.tolist()
    ([(0, 2), (3, 4)], [False, False, False, False, False])
    """
    out: list[tuple[int, int]] = []
    for first, last in runs:
        stop, end = min(first + longest, len(free)) - 1, last
        while end < stop and free[end + 1]:
            end += 1
            free[end] = False
        out.append((first, end))
    return out
