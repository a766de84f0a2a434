"""The plan of an epoch whose mixture weights follow a :class:`~._weights.MixtureSchedule`.

The epoch is cut into *segments* at the schedule's piece boundaries (in global batches);
each segment is planned as its own mixture with its piece's weights (``docs/plan.md``,
*Mixture schedules*):

1. **Epoch size.** ``M`` = ``PlanConfig.epoch_size``, else the sources' own total, and
   ``num_batches`` = ``M // B`` (drop) or ``ceil(M / B)`` (pad), as without a schedule. The
   epoch covers global steps ``[e N, (e + 1) N)``; the schedule's pieces cut that range
   into segments ``[a_k, b_k)`` of batches.
2. **Counts.** Segment ``k`` holds ``(b_k - a_k) B`` items (the last one ``M - a_k B``);
   source ``s`` gets ``c_sk`` of them, by largest remainder on the piece's weights: a pure
   function of the segment's bounds and weights. A source's epoch total is
   ``T_s = sum_k c_sk``.
3. **Source sequences.** Each source's ``T_s`` items are its spans as a plain epoch would
   take them (:func:`~._mixture.build_spans`: repeats, rotating subsets whose cursor
   advances by what the earlier epochs took of the source, :func:`earlier_totals`), in a
   seeded order per ``(seed, epoch, source)``. Segment ``k`` takes items
   ``[c_s0 + ... + c_s(k-1), ... + c_sk)`` of that sequence, cutting at most two spans, so
   every sample is used once per its repeat budget across the segments, and each segment
   reads whole shards except at its two cuts.
4. **Segments.** A segment's items are laid out, partitioned and mixed like a whole
   epoch (:meth:`~._epoch.EpochPlan.segment`, keys of its own); batch ``b`` is batch
   ``b - a_k`` of segment ``k``. Position -> (segment, offset) is one ``searchsorted``
   over the segment starts, so resuming is O(1) and elastic as before.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardstream.errors import PlanError
from shardstream.plan._bijection import derive_key, permute
from shardstream.plan._config import PlanConfig, SourceSpec
from shardstream.plan._epoch import PLAN_ALGORITHM, EpochPlan
from shardstream.plan._fingerprint import plan_fingerprint
from shardstream.plan._mixture import SpanTable, build_spans
from shardstream.plan._weights import MixtureSchedule

I64 = NDArray[np.int64]

_TAG_SOURCE_ORDER = 21


def split_by_weights(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder, ties by order)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    alloc = np.floor(exact).astype(np.int64)
    left = total - int(alloc.sum())
    order = np.argsort(-(exact - alloc), kind="stable")
    alloc[order[:left]] += 1
    return [int(a) for a in alloc.tolist()]


def epoch_segments(
    schedule: MixtureSchedule, epoch: int, num_batches: int
) -> list[tuple[int, int, tuple[float, ...]]]:
    """``(first batch, stop batch, weights)`` of the epoch's segments, in order.

    Steps count global batches over the run: epoch ``e`` is steps ``[e N, (e + 1) N)``.

    >>> from shardstream.plan._weights import Phase
    >>> s = MixtureSchedule([Phase(until=15, weights=(1, 0)), Phase(weights=(0, 1))])
    >>> epoch_segments(s, 1, 10)
    [(0, 5, (1.0, 0.0)), (5, 10, (0.0, 1.0))]
    """
    return segments_of(schedule.pieces(), epoch, num_batches)


def segments_of(
    pieces: Sequence[tuple[int, tuple[float, ...]]], epoch: int, num_batches: int
) -> list[tuple[int, int, tuple[float, ...]]]:
    """:func:`epoch_segments` over pieces already made (O(segments of the epoch))."""
    lo, hi = epoch * num_batches, (epoch + 1) * num_batches
    i = max(0, bisect.bisect_right([start for start, _ in pieces], lo) - 1)
    out = []
    while i < len(pieces) and pieces[i][0] < hi:
        start, weights = pieces[i]
        stop = pieces[i + 1][0] if i + 1 < len(pieces) else hi
        a, b = max(start, lo), min(stop, hi)
        if a < b:
            out.append((a - lo, b - lo, weights))
        i += 1
    return out


def segment_counts(
    segments: Sequence[tuple[int, int, tuple[float, ...]]], num_samples: int, batch: int
) -> list[list[int]]:
    """``[segment][source]``: the items each source gives each segment of an epoch of
    ``num_samples`` (step 2 of the module: the last segment holds the epoch's tail)."""
    items = [(stop - a) * batch for a, stop, _ in segments]
    items[-1] = num_samples - segments[-1][0] * batch
    return [split_by_weights(n, w) for n, (_, _, w) in zip(items, segments, strict=True)]


def earlier_totals(
    pieces: Sequence[tuple[int, tuple[float, ...]]],
    epoch: int,
    num_batches: int,
    num_samples: int,
    batch: int,
) -> list[list[tuple[int, int]]]:
    """Per source, ``(total, epochs)``: what epochs ``0 .. epoch-1`` took of it, grouped
    (for :func:`~._mixture.build_spans`'s cursor). Epochs inside one piece take the same,
    so this costs O(pieces), never O(epochs): the epochs a piece holds whole are counted
    at once, and at most one epoch per piece boundary is cut into segments."""
    n, num_sources = num_batches, len(pieces[0][1])
    out: list[list[tuple[int, int]]] = [[] for _ in range(num_sources)]
    cut = sorted({start // n for start, _ in pieces[1:] if start % n and start // n < epoch})
    for e in cut:
        counts = segment_counts(segments_of(pieces, e, n), num_samples, batch)
        for s in range(num_sources):
            out[s].append((sum(row[s] for row in counts), 1))
    for i, (start, weights) in enumerate(pieces):
        first = -(-start // n)
        stop = min(pieces[i + 1][0] // n if i + 1 < len(pieces) else epoch, epoch)
        if stop > first:
            for s, total in enumerate(split_by_weights(num_samples, weights)):
                out[s].append((total, stop - first))
    return out


def _cut(spans: SpanTable, starts: I64, a: int, b: int, sizes: I64) -> SpanTable:
    """Items ``[a, b)`` of the span sequence ``spans`` (``starts``: its cumulative sizes)."""
    first = int(np.searchsorted(starts, a, side="right")) - 1
    last = int(np.searchsorted(starts, b - 1, side="right")) - 1
    sel = slice(first, last + 1)
    lo = np.maximum(starts[sel], a) - starts[sel]  # items skipped at the front of each
    hi = np.minimum(starts[first + 1 : last + 2], b) - starts[sel]
    shard = spans.shard[sel]
    return SpanTable(
        shard=shard,
        size=(hi - lo).astype(np.int64),
        rot=((spans.rot[sel] + lo) % sizes[shard]).astype(np.int64),
        key=spans.key[sel],
    )


def check_schedule(schedule: MixtureSchedule, sources: Sequence[SourceSpec]) -> None:
    """Raise :class:`PlanError` unless ``schedule`` fits ``sources``: one weight per
    source, and no source with a share of its own."""
    if not sources:
        raise PlanError("a scheduled plan needs at least one SourceSpec")
    if schedule.num_sources != len(sources):
        raise PlanError(
            f"the mixture schedule gives {schedule.num_sources} weights per phase but "
            f"there are {len(sources)} sources: give one weight per source, in order"
        )
    for src in sources:
        modes = [m for m in ("weight", "repeat", "count") if getattr(src, m) is not None]
        if modes:
            raise PlanError(
                f"source {src.name or '(unnamed)'} sets {modes[0]}, but under a mixture "
                f"schedule the schedule's weights decide every source's share; drop it"
            )


class ScheduledPlan:
    """An epoch's sample order with per-segment mixture weights (pure, O(spans) memory).

    Speaks :class:`~._epoch.EpochPlan`'s interface (what a reader and the audit use).

    >>> from shardstream.plan._weights import Phase
    >>> cfg = PlanConfig(seed=1, global_batch_size=4)
    >>> srcs = [SourceSpec(shard_sizes=np.array([8, 8])), SourceSpec(shard_sizes=np.array([16]))]
    >>> plan = ScheduledPlan(srcs, cfg, 0, MixtureSchedule(
    ...     [Phase(until=4, weights=(1, 0)), Phase(weights=(0, 1))]))
    >>> plan.num_batches, plan.source_totals
    (8, [16, 16])
    """

    def __init__(
        self,
        sources: Sequence[SourceSpec],
        config: PlanConfig,
        epoch: int,
        schedule: MixtureSchedule,
    ) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise PlanError(f"epoch must be an integer >= 0, got {epoch!r}")
        check_schedule(schedule, sources)
        self.config, self.epoch, self.sources = config, int(epoch), tuple(sources)
        self.schedule = schedule
        sizes = np.concatenate([s.shard_sizes for s in self.sources])
        self.shard_sizes: I64 = sizes
        self.shard_starts: I64 = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.source_shard_offsets: I64 = np.cumsum([0] + [s.shard_sizes.size for s in sources])
        b = config.global_batch_size
        self.num_samples = int(config.epoch_size or sum(s.num_samples for s in sources))
        self.num_batches = (
            self.num_samples // b if config.tail == "drop" else -(-self.num_samples // b)
        )
        if self.num_batches == 0:
            raise PlanError(
                f"the epoch has {self.num_samples} samples, fewer than one global batch "
                f"(PlanConfig.global_batch_size={b}); lower the batch size or use tail='pad'"
            )
        pieces = schedule.pieces()
        segs = segments_of(pieces, self.epoch, self.num_batches)
        self.segment_starts: I64 = np.array([a for a, _, _ in segs], dtype=np.int64)
        self.segment_weights = [w for _, _, w in segs]
        self.segment_counts: I64 = np.array(
            segment_counts(segs, self.num_samples, b), dtype=np.int64
        ).reshape(len(segs), len(sources))
        """``[segment, source]``: items each source gives each segment."""
        self.source_totals = [int(t) for t in self.segment_counts.sum(axis=0).tolist()]
        self._earlier = earlier_totals(pieces, self.epoch, self.num_batches, self.num_samples, b)
        self._sequences = self._source_sequences()
        self._segments: dict[int, EpochPlan] = {}

    def _source_sequences(self) -> list[tuple[SpanTable, I64]]:
        """Each source's epoch items as a span sequence in its seeded order, with the
        cumulative item counts of its spans."""
        config = self.config
        table = build_spans(self.sources, config, self.epoch, self.source_totals, self._earlier)
        source_of = np.searchsorted(self.source_shard_offsets, table.shard, side="right") - 1
        out = []
        for s in range(len(self.sources)):
            idx = np.flatnonzero(source_of == s)
            if config.shuffle and idx.size > 1:
                key = derive_key(config.seed, self.epoch, _TAG_SOURCE_ORDER, s)
                idx = idx[permute(np.arange(idx.size), idx.size, key)]
            spans = SpanTable(table.shard[idx], table.size[idx], table.rot[idx], table.key[idx])
            starts = np.concatenate(([0], np.cumsum(spans.size))).astype(np.int64)
            out.append((spans, starts))
        return out

    # ---- segments ------------------------------------------------------------------------
    @property
    def num_segments(self) -> int:
        """Segments of this epoch (constant-weight runs of batches)."""
        return int(self.segment_starts.size)

    def segment_bounds(self, k: int) -> tuple[int, int]:
        """``[first, stop)`` global batches of segment ``k``."""
        stop = int(self.segment_starts[k + 1]) if k + 1 < self.num_segments else self.num_batches
        return int(self.segment_starts[k]), stop

    def segment_of(self, b: ArrayLike) -> I64:
        """Segment of each global batch ``b`` (arithmetic: one ``searchsorted``)."""
        out: I64 = np.searchsorted(self.segment_starts, b, side="right") - 1
        return out

    def segment_plan(self, k: int) -> EpochPlan:
        """Segment ``k`` planned as its own mixture (cached)."""
        plan = self._segments.get(k)
        if plan is None:
            before = self.segment_counts[:k].sum(axis=0)
            parts = []
            for s, (spans, starts) in enumerate(self._sequences):
                c = int(self.segment_counts[k, s])
                if c:
                    a = int(before[s])
                    parts.append(_cut(spans, starts, a, a + c, self.shard_sizes))
            table = SpanTable(
                shard=np.concatenate([p.shard for p in parts]),
                size=np.concatenate([p.size for p in parts]),
                rot=np.concatenate([p.rot for p in parts]),
                key=np.concatenate([p.key for p in parts]),
            )
            totals = self.segment_counts[k].tolist()
            plan = EpochPlan.segment(
                self.sources, self.config, self.epoch, table, index=k, totals=totals
            )
            self._segments[k] = plan
        return plan

    # ---- sizes -----------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """Shards over all sources."""
        return int(self.shard_sizes.size)

    @property
    def total_samples(self) -> int:
        """Samples stored over all sources."""
        return int(self.shard_starts[-1])

    @property
    def num_positions(self) -> int:
        """Sample positions in the epoch: ``num_batches * global_batch_size``."""
        return self.num_batches * self.config.global_batch_size

    @property
    def fingerprint(self) -> str:
        """Digest of everything the order depends on except the epoch (schedule included)."""
        return plan_fingerprint(PLAN_ALGORITHM, self.config, self.sources, self.schedule)

    # ---- the order -----------------------------------------------------------------------
    def _check_batch(self, b: int) -> None:
        if not 0 <= b < self.num_batches:
            raise PlanError(f"batch {b} is outside 0 .. num_batches-1 = {self.num_batches - 1}")

    def rank_layout(self, rank: int, world_size: int) -> tuple[I64, I64, I64]:
        """See :meth:`EpochPlan.rank_layout` (the same for every segment)."""
        return self.segment_plan(0).rank_layout(rank, world_size)

    def rank_batch(self, b: int, rank: int, world_size: int) -> I64:
        """Global sample ids of ``rank``'s part of global batch ``b``."""
        self._check_batch(b)
        k = int(self.segment_of(b))
        return self.segment_plan(k).rank_batch(b - int(self.segment_starts[k]), rank, world_size)

    def rank_batches(self, batches: ArrayLike, rank: int, world_size: int) -> I64:
        """Several of ``rank``'s batches at once, shape ``(len(batches), B / world_size)``."""
        bs = np.asarray(batches, dtype=np.int64).reshape(-1)
        if bs.size and (bs.min() < 0 or bs.max() >= self.num_batches):
            self._check_batch(int(bs[(bs < 0) | (bs >= self.num_batches)][0]))
        per = self.config.rank_batch_size(world_size)
        out = np.empty((bs.size, per), dtype=np.int64)
        seg = self.segment_of(bs)
        for k in np.unique(seg).tolist():
            sel = seg == k
            local = bs[sel] - self.segment_starts[k]
            out[sel] = self.segment_plan(k).rank_batches(local, rank, world_size)
        if not bs.size:
            self.rank_layout(rank, world_size)  # validates rank and world size
        return out

    def iter_rank_batches(
        self, rank: int, world_size: int, batches: Sequence[int], chunk: int = 64
    ) -> Iterator[tuple[int, I64]]:
        """``(b, ids)`` for each ``b`` in ``batches``, ``chunk`` batches per call."""
        for i in range(0, len(batches), chunk):
            sel = np.asarray(batches[i : i + chunk], dtype=np.int64)
            yield from zip(sel.tolist(), self.rank_batches(sel, rank, world_size), strict=True)

    def global_batches(self, start: int, stop: int) -> I64:
        """Ids of global batches ``start .. stop-1`` concatenated (each in rank order)."""
        if not 0 <= start <= stop <= self.num_batches:
            raise PlanError(f"batch range {start}:{stop} is outside 0:{self.num_batches}")
        parts = [np.zeros(0, dtype=np.int64)]
        for k in range(self.num_segments):
            a, z = self.segment_bounds(k)
            lo, hi = max(a, start), min(z, stop)
            if lo < hi:
                parts.append(self.segment_plan(k).global_batches(lo - a, hi - a))
        return np.concatenate(parts)

    def worker_batches(self, start_batch: int, worker: int, num_workers: int) -> range:
        """See :meth:`EpochPlan.worker_batches`."""
        if not 0 <= worker < num_workers:
            raise PlanError(f"worker={worker} is outside 0 .. num_workers-1 = {num_workers - 1}")
        return range(start_batch + worker, self.num_batches, num_workers)

    # ---- shards ----------------------------------------------------------------------------
    def rank_schedule(
        self, rank: int, world_size: int, start_batch: int = 0
    ) -> tuple[I64, I64, I64]:
        """See :meth:`EpochPlan.rank_schedule`: the segments' schedules from
        ``start_batch`` on, end to end, each shard at its first need."""
        empty = np.zeros(0, dtype=np.int64)
        if start_batch != self.num_batches:
            self._check_batch(start_batch)
        shards, firsts, lasts = [empty], [empty], [empty]
        for k in range(self.num_segments):
            a, z = self.segment_bounds(k)
            if z <= start_batch:
                continue
            s, f, last = self.segment_plan(k).rank_schedule(
                rank, world_size, max(0, start_batch - a)
            )
            shards.append(s)
            firsts.append(f + a)
            lasts.append(last + a)
        shard_all = np.concatenate(shards)
        first_all, last_all = np.concatenate(firsts), np.concatenate(lasts)
        uniq, where, inverse = np.unique(shard_all, return_index=True, return_inverse=True)
        last_per = np.full(uniq.size, -1, dtype=np.int64)
        np.maximum.at(last_per, inverse, last_all)
        keep = np.sort(where)
        return shard_all[keep], first_all[keep], last_per[inverse[keep]]

    def rank_shards(self, rank: int, world_size: int, start_batch: int = 0) -> I64:
        """Global shard indices ``rank`` reads from ``start_batch`` on, in need order."""
        return self.rank_schedule(rank, world_size, start_batch)[0]

    def rank_shard_shares(self, rank: int, world_size: int) -> tuple[I64, NDArray[np.float64]]:
        """See :meth:`EpochPlan.rank_shard_shares`, summed over the segments."""
        shards, shares = [], []
        for k in range(self.num_segments):
            s, share = self.segment_plan(k).rank_shard_shares(rank, world_size)
            shards.append(s)
            shares.append(share)
        uniq, inverse = np.unique(np.concatenate(shards), return_inverse=True)
        total = np.zeros(uniq.size, dtype=np.float64)
        np.add.at(total, inverse, np.concatenate(shares))
        return uniq.astype(np.int64), np.minimum(total, 1.0)

    def locate(self, ids: ArrayLike) -> tuple[I64, I64]:
        """Split global sample ids into (global shard index, index inside that shard)."""
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.total_samples):
            raise PlanError(f"sample ids must lie in 0 .. {self.total_samples - 1}")
        shard = np.searchsorted(self.shard_starts, arr, side="right") - 1
        return shard.astype(np.int64), arr - self.shard_starts[shard]


def make_plan(
    sources: Sequence[SourceSpec],
    config: PlanConfig,
    epoch: int,
    schedule: MixtureSchedule | None = None,
) -> EpochPlan | ScheduledPlan:
    """The epoch's plan: an :class:`EpochPlan`, or a :class:`ScheduledPlan` with a schedule."""
    if schedule is None:
        return EpochPlan(sources, config, epoch)
    return ScheduledPlan(sources, config, epoch, schedule)


AnyPlan = EpochPlan | ScheduledPlan
"""Either kind of epoch plan (they speak the same interface)."""
