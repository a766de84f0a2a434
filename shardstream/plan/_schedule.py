"""Which shards a rank reads, when: the plan's prefetch and eviction schedule.

Works on the span layout only (O(spans) time and memory): a rank's partitions are
contiguous item ranges, so its shards are the spans those ranges touch, and the mixing
blocks holding a span's items bound the batches that read it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardstream.plan._mixing import plain_blocks, shifted_blocks

I64 = NDArray[np.int64]


@dataclass(frozen=True)
class PlanView:
    """The parts of an :class:`~.EpochPlan` the schedule needs."""

    span_start: I64
    span_shard: I64
    num_samples: int
    num_batches: int
    partition_size: int
    partition_batch_size: int
    block: int


def spans_between(view: PlanView, a: int, b: int) -> tuple[I64, I64, I64]:
    """Spans touching extended items ``[a, b)``: (span, touch start, touch end).

    Extended items past the epoch's end wrap around (``tail="pad"``).
    """
    m, starts_of = view.num_samples, view.span_start
    spans: list[I64] = []
    starts: list[I64] = []
    ends: list[I64] = []
    while a < b:
        base = (a // m) * m
        lo, hi = a - base, min(b - base, m)
        first = int(np.searchsorted(starts_of, lo, side="right")) - 1
        last = int(np.searchsorted(starts_of, hi - 1, side="right")) - 1
        idx = np.arange(first, last + 1, dtype=np.int64)
        spans.append(idx)
        starts.append(base + np.maximum(starts_of[idx], lo))
        ends.append(base + np.minimum(starts_of[idx + 1], hi))
        a = base + hi
    return np.concatenate(spans), np.concatenate(starts), np.concatenate(ends)


def rank_schedule(view: PlanView, parts: I64, lo: I64, start_batch: int) -> tuple[I64, I64, I64]:
    """``(shards, first, last)`` for a rank reading slots ``[lo, hi)`` of ``parts``.

    A span whose items lie in windows ``i .. j`` of its partition is read only by batches
    whose positions fall in those windows; shards are listed once, at their first need,
    with the last batch over all their spans.
    """
    empty = np.zeros(0, dtype=np.int64)
    if start_batch >= view.num_batches:
        return empty, empty, empty
    q, s, v = view.partition_batch_size, view.partition_size, view.block
    firsts, lasts, shards = [], [], []
    for p, p_lo in zip(parts.tolist(), lo.tolist(), strict=True):
        # Items reachable from the resume position: from the plain block holding the start
        # of the shifted block that holds the first position still to be read. A rank
        # reading only slots [lo, hi) of a partition still needs all of it (the mixing
        # spreads every slot over the whole window), so hi bounds nothing here.
        t0 = np.array([start_batch * q + p_lo], dtype=np.int64)
        x0 = int(plain_blocks(shifted_blocks(t0, v, s)[1], v, s)[1][0]) if v > 1 else int(t0[0])
        spans, starts, ends = spans_between(view, p * s + x0, (p + 1) * s)
        xs, xe = starts - p * s, ends - p * s
        if v > 1:
            # Items in plain blocks i..j sit (before stage A) at positions of those blocks,
            # which stage B draws from the shifted blocks holding them.
            first_pos = shifted_blocks(plain_blocks(xs, v, s)[1], v, s)[1]
            last_pos = shifted_blocks(plain_blocks(xe - 1, v, s)[2] - 1, v, s)[2] - 1
        else:
            first_pos, last_pos = xs, xe - 1
        firsts.append(np.maximum(first_pos // q, start_batch))
        lasts.append(last_pos // q)
        shards.append(view.span_shard[spans])
    first_all, last_all = np.concatenate(firsts), np.concatenate(lasts)
    shard_all = np.concatenate(shards)
    order = np.argsort(first_all, kind="stable")
    shard_all, first_all, last_all = shard_all[order], first_all[order], last_all[order]
    uniq, where, inverse = np.unique(shard_all, return_index=True, return_inverse=True)
    last_per = np.full(uniq.size, -1, dtype=np.int64)
    np.maximum.at(last_per, inverse, last_all)
    keep = np.sort(where)
    return shard_all[keep], first_all[keep], last_per[inverse[keep]]


def rank_shard_items(view: PlanView, parts: I64, lo: I64, hi: I64) -> tuple[I64, I64]:
    """``(shards, items)``: how many of each shard's samples a rank reading slots
    ``[lo, hi)`` of ``parts`` reads over the epoch (rounded down; shards it never reads are
    absent). A rank's partitions cover whole shards except where a partition boundary
    falls inside one (the epoch's tail, uneven shards): there it reads a few samples of a
    shard that another rank reads nearly all of."""
    q, s = view.partition_batch_size, view.partition_size
    shards, items = [], []
    for p, a, b in zip(parts.tolist(), lo.tolist(), hi.tolist(), strict=True):
        spans, starts, ends = spans_between(view, p * s, (p + 1) * s)
        shards.append(view.span_shard[spans])
        items.append((ends - starts) * (b - a) // q)
    if not shards:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    uniq, inverse = np.unique(np.concatenate(shards), return_inverse=True)
    total = np.zeros(uniq.size, dtype=np.int64)
    np.add.at(total, inverse, np.concatenate(items))
    return uniq.astype(np.int64), total
