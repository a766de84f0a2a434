"""Mixing inside a partition: positions -> items by two staggered grids of block bijections.

Stage B permutes positions inside blocks of ``v`` on a grid shifted by ``v/2``; stage A then
permutes inside blocks of ``v`` on the unshifted grid. The composition is a bijection of the
partition's positions (each stage is). An item of A-block ``k`` lands in one of the two
B-blocks that overlap it, so:

* a batch (inside one B-block) draws uniformly from two A-blocks: ``2v`` items, i.e. all
  shards of a ``window = 2v`` span;
* at any moment a reader has two A-blocks' shards open, and at each B-block boundary only
  one A-block (half the window) is retired and one is opened. A single grid would switch
  the whole window at once, so a stall-free cache would need two windows instead of 1.5.

The shifted grid's half-size pieces at the partition's ends are merged into their
neighbours, so the first and last batches mix as many shards as the others. Each block's
bijection is keyed by ``(seed, epoch, partition, stage, block)`` and evaluated on demand.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardstream.plan._bijection import keys_for, permute

I64 = NDArray[np.int64]


def plain_blocks(u: I64, v: int, size: int) -> tuple[I64, I64, I64]:
    """(index, start, end) of the unshifted ``v``-block holding each position ``u``."""
    k = u // v
    start = k * v
    return k, start, np.minimum(start + v, size)


def shifted_blocks(u: I64, v: int, size: int) -> tuple[I64, I64, I64]:
    """(index, start, end) of the ``v/2``-shifted block holding each position ``u``.

    Blocks are ``[k v - v/2, (k+1) v - v/2)``; the half block at the start is merged into
    block 1 and the piece starting inside the last plain block into the one before it, so
    every shifted block overlaps exactly two plain blocks (one when there is only one).
    """
    half = v // 2
    last = max((size - 1) // v, 1)
    k = np.clip((u + half) // v, 1, last)
    start = np.where(k == 1, 0, k * v - half)
    end = np.where(k == last, size, (k + 1) * v - half)
    return k, start, end


def _stage(t: I64, part: I64, k: I64, start: I64, end: I64, *, key: int) -> I64:
    if np.all(k == k[0]) and np.all(part == part[0]):
        # One block of one partition (the usual rank batch): scalar domain and key.
        s0, n0 = int(start[0]), int(end[0] - start[0])
        out: I64 = s0 + permute(t - s0, n0, keys_for(key, int(part[0]), int(k[0]))[0])
        return out
    out = start + permute(t - start, end - start, keys_for(key, part, k))
    return out


def mix_positions(t: I64, part: I64, v: int, *, size: int, key_a: int, key_b: int) -> I64:
    """Items (partition-relative) at positions ``t`` of partitions ``part``."""
    if t.size == 0 or v <= 1:
        return t
    inner = _stage(t, part, *shifted_blocks(t, v, size), key=key_b)
    return _stage(inner, part, *plain_blocks(inner, v, size), key=key_a)
