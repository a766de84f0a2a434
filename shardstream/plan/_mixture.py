"""Mixtures: how many samples each source and each shard contributes to an epoch.

The output is a *span table*: one row per contiguous run of an epoch's items that come
from one shard. A shard taken ``c <= n`` times (``n`` = its samples) is one span; a shard
repeated more than once is cut into ``ceil(c / n)`` spans of at most ``n`` items, so its
repeats land at different places in the epoch. Item ``j`` of a span reads sample
``sigma((rot + j) mod n)`` of its shard, where ``sigma`` is a seeded bijection of the shard's
sample indices (:func:`~._bijection.permute` with the span's ``key``). Everything is
O(shards x max repeat) memory and never O(samples).

Choosing exactly ``T`` of a source's ``N`` samples:

* per shard ``k`` with cumulative size ``C_k``: ``c_k = floor((T C_{k+1} + phi) / N) -
  floor((T C_k + phi) / N)``. The sum telescopes to exactly ``T``; every ``c_k`` is within
  one of the proportional share ``T n_k / N``; ``phi`` (random per epoch) decides which
  shards get the rounding extra, so no shard is favoured over epochs.
* inside a shard, a fractional share takes a window of ``sigma``'s order starting at a
  cursor that advances by the shard's share every epoch (the sum of the earlier epochs'
  shares, which a mixture schedule changes from epoch to epoch), so consecutive epochs
  see disjoint samples until the shard is covered (epoch-wise coverage, not luck). With a
  whole repeat factor there is nothing to rotate, and ``sigma`` changes per epoch instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from shardstream.errors import PlanError
from shardstream.plan._bijection import derive_key, keys_for
from shardstream.plan._config import PlanConfig, SourceSpec

I64 = NDArray[np.int64]

_TAG_PHI = 1
_TAG_SIGMA = 2
_TAG_CURSOR = 3


def source_totals(sources: Sequence[SourceSpec], config: PlanConfig) -> list[int]:
    """Samples each source contributes to one epoch (the same for every epoch)."""
    totals: list[int | None] = []
    for src in sources:
        if src.count is not None:
            totals.append(int(src.count))
        elif src.repeat is not None:
            totals.append(round(src.repeat * src.num_samples))
        elif src.weight is not None:
            totals.append(None)
        else:
            totals.append(src.num_samples)
    weighted = [i for i, t in enumerate(totals) if t is None]
    fixed = sum(t for t in totals if t is not None)
    if not weighted:
        if config.epoch_size is not None:
            raise PlanError(
                "PlanConfig.epoch_size only applies to sources with a weight; set weight= on "
                "the sources that should share it, or drop epoch_size"
            )
        return [int(t) for t in totals if t is not None]
    if config.epoch_size is None:
        share = sum(sources[i].num_samples for i in weighted)
    else:
        share = config.epoch_size - fixed
        if share < 0:
            raise PlanError(
                f"PlanConfig.epoch_size={config.epoch_size} is smaller than the {fixed} "
                f"samples the repeat/count sources already take; raise epoch_size"
            )
    weights = np.array([float(sources[i].weight or 0.0) for i in weighted])
    exact = share * weights / weights.sum()
    alloc = np.floor(exact).astype(np.int64)
    # Largest remainder (ties by source order) so the shares add up to exactly `share`.
    left = share - int(alloc.sum())
    order = np.argsort(-(exact - alloc), kind="stable")
    alloc[order[:left]] += 1
    out = [0 if t is None else int(t) for t in totals]
    for i, a in zip(weighted, alloc.tolist(), strict=True):
        out[i] = int(a)
    return out


def _floor_div_scaled(t: int, cum: I64, phi: int, n: int) -> I64:
    """``floor((t * cum + phi) / n)`` elementwise without int64 overflow for t < n."""
    if n < (1 << 31):
        return (t * cum + phi) // n
    obj = (cum.astype(object) * t + phi) // n
    return np.asarray(obj, dtype=np.int64)


def _advance(past: Sequence[tuple[int, int]], sizes: I64) -> I64:
    """How far each shard's cursor moved over the earlier epochs: the sum of their
    fractional shares, ``epochs x (rest x n_k // N)`` per ``(total, epochs)`` of ``past``
    (modulo the shard's size, so the sum never overflows). Whole repeats (``rest == 0``)
    move nothing: they read every sample and rotate nothing."""
    n_src = int(sizes.sum())
    safe = np.maximum(sizes, 1)
    out = np.zeros(sizes.size, dtype=np.int64)
    for total, epochs in past:
        rest = int(total) % n_src
        if rest == 0 or epochs == 0:
            continue
        share = (rest * sizes) // n_src
        out = (out + (share * (int(epochs) % safe)) % safe) % safe
    return out


@dataclass(frozen=True)
class SpanTable:
    """The epoch's items grouped into spans (unpermuted: in source then shard order).

    Attributes:
        shard: global shard index of each span.
        size: items in each span (>= 1).
        rot: start of the span's window in its shard's ``sigma`` order.
        key: key of the shard's ``sigma`` bijection.
    """

    shard: I64
    size: I64
    rot: I64
    key: NDArray[np.uint64]

    def __len__(self) -> int:
        return int(self.shard.size)


def build_spans(
    sources: Sequence[SourceSpec],
    config: PlanConfig,
    epoch: int,
    totals: Sequence[int],
    earlier: Sequence[Sequence[tuple[int, int]]] | None = None,
) -> SpanTable:
    """Spans of every source for ``epoch``, sources in order, shards in order.

    ``earlier`` (per source: ``(total, epochs)`` pairs) is what the earlier epochs took of
    each source, for a fractional share's cursor to continue where they stopped; ``None``
    means ``epoch`` epochs of ``totals`` (a plain mixture: the same every epoch). A mixture
    schedule changes a source's total between epochs, so it passes its own.
    """
    parts: list[tuple[I64, I64, I64, NDArray[np.uint64]]] = []
    shard_base = 0
    for s, (src, total) in enumerate(zip(sources, totals, strict=True)):
        sizes = src.shard_sizes
        n_src = src.num_samples
        full, rest = divmod(total, n_src)
        cum = np.concatenate(([0], np.cumsum(sizes)))
        phi = derive_key(config.seed, epoch, s, _TAG_PHI) % n_src
        floors = _floor_div_scaled(rest, cum, phi, n_src)
        counts = full * sizes + np.diff(floors)
        gidx = np.arange(sizes.size, dtype=np.int64) + shard_base
        if rest == 0:
            # Whole repeats: nothing to rotate; a fresh in-shard order every epoch instead.
            keys = keys_for(derive_key(config.seed, epoch, _TAG_SIGMA), gidx)
            rot = np.zeros(sizes.size, dtype=np.int64)
        else:
            # Fractional share: a fixed in-shard order, read from a cursor that advances by
            # the shard's share each epoch (also without shuffle, for coverage).
            keys = keys_for(derive_key(config.seed, _TAG_SIGMA), gidx)
            start = keys_for(derive_key(config.seed, _TAG_CURSOR), gidx)
            safe = np.maximum(sizes, 1)
            past = [(total, epoch)] if earlier is None else earlier[s]
            rot = ((start % safe.astype(np.uint64)).astype(np.int64) + _advance(past, sizes)) % safe
        shard_base += sizes.size
        keep = counts > 0
        sizes, counts, gidx, keys, rot = (
            sizes[keep],
            counts[keep],
            gidx[keep],
            keys[keep],
            rot[keep],
        )
        pieces = -(-counts // sizes)
        row = np.repeat(np.arange(sizes.size), pieces)
        first = np.cumsum(pieces) - pieces
        piece = np.arange(row.size) - first[row]
        size = np.minimum(sizes[row], counts[row] - piece * sizes[row])
        parts.append((gidx[row], size, rot[row], keys[row]))
    shard = np.concatenate([p[0] for p in parts]).astype(np.int64)
    return SpanTable(
        shard=shard,
        size=np.concatenate([p[1] for p in parts]).astype(np.int64),
        rot=np.concatenate([p[2] for p in parts]).astype(np.int64),
        key=np.concatenate([p[3] for p in parts]).astype(np.uint64),
    )
