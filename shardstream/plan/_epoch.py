"""The epoch plan: which sample every rank reads at every global batch.

Layout of one epoch (``docs/plan.md`` has the reasoning):

1. **Items.** Sources become spans (:mod:`._mixture`); the span list is permuted with a
   seeded bijection per ``(seed, epoch)``. Concatenated, the spans are the epoch's ``M``
   items ``X = 0 .. M-1``.
2. **Tail.** ``num_batches = M // B`` (drop) or ``ceil(M / B)`` (pad). The extended item
   range ``[0, num_batches * B)`` is read modulo ``M``: ``drop`` leaves out the last items,
   ``pad`` wraps around to the first ones.
3. **Partitions.** Partition ``p`` owns the contiguous items ``[p S, (p+1) S)`` with
   ``S = num_batches * B / P``; that contiguity is what makes the plan local.
4. **Mixing.** Positions ``t`` of a partition map to its items through two staggered grids
   of seeded block bijections with blocks of ``window / 2`` (:mod:`._mixing`): every batch
   draws from all shards of a ``window``-sized span, and half a window turns over at a time.
5. **Batches.** Global batch ``b`` = for each partition, positions ``b q .. b q + q - 1``
   (``q = B / P``), partitions end to end. Rank ``r`` of ``W`` takes the contiguous slots
   ``[r B / W, (r+1) B / W)`` of it, for every ``W`` dividing ``B``: the global batches do
   not depend on the world size, which is what makes resuming on any world size exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardstream.errors import PlanError
from shardstream.plan._bijection import derive_key, permute
from shardstream.plan._config import PlanConfig, SourceSpec
from shardstream.plan._fingerprint import plan_fingerprint
from shardstream.plan._mixing import mix_positions
from shardstream.plan._mixture import SpanTable, build_spans, source_totals
from shardstream.plan._schedule import PlanView, rank_schedule, rank_shard_items

I64 = NDArray[np.int64]

PLAN_ALGORITHM = 1
"""Version of the order algorithm; part of the fingerprint, so a resume state is never
applied to a plan whose order was computed differently. Bump on any change of output."""

_TAG_SPANS = 11
_TAG_BLOCKS = 12
_TAG_STAGGER = 13
_TAG_SEGMENT = 14
_DEFAULT_WINDOW_SHARDS = 8
_CHUNK = 32  # batches computed together by rank_batch
_RUNS_KEPT = 4


class EpochPlan:
    """The sample order of one epoch, computed on demand (pure, O(shards) memory).

    >>> cfg = PlanConfig(seed=1, global_batch_size=8, num_partitions=2)
    >>> plan = EpochPlan([SourceSpec(shard_sizes=np.array([10, 10, 12]))], cfg, epoch=0)
    >>> plan.num_batches, plan.rank_batch(0, rank=0, world_size=2).size
    (4, 4)
    """

    def __init__(self, sources: Sequence[SourceSpec], config: PlanConfig, epoch: int = 0) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise PlanError(f"epoch must be an integer >= 0, got {epoch!r}")
        if not sources:
            raise PlanError("EpochPlan needs at least one SourceSpec")
        self.config = config
        self.epoch = int(epoch)
        self.sources = tuple(sources)
        self.shard_sizes: I64
        self.shard_starts: I64
        self.source_shard_offsets: I64
        self._set_shards()
        self.source_totals = source_totals(self.sources, config)
        spans = build_spans(self.sources, config, self.epoch, self.source_totals)
        self._lay_out(spans, derive_key(config.seed, self.epoch, _TAG_SPANS), salt=())

    @classmethod
    def segment(
        cls,
        sources: Sequence[SourceSpec],
        config: PlanConfig,
        epoch: int,
        spans: SpanTable,
        *,
        index: int,
        totals: Sequence[int],
    ) -> EpochPlan:
        """The plan of one segment of a scheduled epoch (:mod:`._scheduled`): ``spans``
        are the segment's items, laid out, partitioned and mixed like a whole epoch's with
        keys of their own (``index``)."""
        plan = cls.__new__(cls)
        plan.config, plan.epoch, plan.sources = config, int(epoch), tuple(sources)
        plan._set_shards()
        plan.source_totals = list(totals)
        salt = (_TAG_SEGMENT, index)
        plan._lay_out(spans, derive_key(config.seed, plan.epoch, _TAG_SPANS, *salt), salt=salt)
        return plan

    def _set_shards(self) -> None:
        sizes = np.concatenate([s.shard_sizes for s in self.sources])
        self.shard_sizes = sizes
        self.shard_starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.source_shard_offsets = np.cumsum([0] + [s.shard_sizes.size for s in self.sources])

    def _lay_out(self, spans: SpanTable, span_key: int, salt: tuple[int, ...]) -> None:
        """Permute ``spans`` (the epoch's items), cut the tail, size partitions and window."""
        config = self.config
        if config.shuffle and len(spans) > 1:
            order = permute(np.arange(len(spans)), len(spans), span_key)
            spans = SpanTable(
                spans.shard[order], spans.size[order], spans.rot[order], spans.key[order]
            )
        self._spans = spans
        self._span_start: I64 = np.concatenate(([0], np.cumsum(spans.size))).astype(np.int64)
        self.num_samples = int(self._span_start[-1])
        b = config.global_batch_size
        if self.num_samples == 0:
            raise PlanError("the sources contribute no samples to the epoch; check their weights")
        if config.tail == "drop":
            self.num_batches = self.num_samples // b
        else:
            self.num_batches = -(-self.num_samples // b)
        if self.num_batches == 0:
            raise PlanError(
                f"the epoch has {self.num_samples} samples, fewer than one global batch "
                f"(PlanConfig.global_batch_size={b}); lower the batch size or use tail='pad'"
            )
        self.partition_size = self.num_batches * config.partition_batch_size
        mean_span = -(-self.num_samples // len(spans))
        window = config.window or _DEFAULT_WINDOW_SHARDS * mean_span
        self.window = int(min(window, self.partition_size))
        # Two staggered grids of half-window blocks: see _mixing.
        self.block = max(1, -(-self.window // 2))
        self._block_key = derive_key(config.seed, self.epoch, _TAG_BLOCKS, *salt)
        self._stagger_key = derive_key(config.seed, self.epoch, _TAG_STAGGER, *salt)
        self._runs: dict[tuple[int, int, int], I64] = {}

    # ---- sizes -------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """Shards over all sources (global shard indices are ``0 .. num_shards - 1``)."""
        return int(self.shard_sizes.size)

    @property
    def total_samples(self) -> int:
        """Samples stored over all sources (global sample ids are ``0 .. total - 1``)."""
        return int(self.shard_starts[-1])

    @property
    def num_positions(self) -> int:
        """Sample positions in the epoch: ``num_batches * global_batch_size``."""
        return self.num_batches * self.config.global_batch_size

    @property
    def fingerprint(self) -> str:
        """Hex digest of everything the order depends on except the epoch.

        A resume state made under one fingerprint is only valid for a plan with the same one.
        """
        return plan_fingerprint(PLAN_ALGORITHM, self.config, self.sources)

    # ---- the order -----------------------------------------------------------------------
    def _items(self, part: I64, t: I64) -> I64:
        """Global sample ids at positions ``t`` of partitions ``part`` (vectorized)."""
        cfg = self.config
        if cfg.shuffle:
            x = mix_positions(
                t,
                part,
                self.block,
                size=self.partition_size,
                key_a=self._block_key,
                key_b=self._stagger_key,
            )
        else:
            x = t
        return self._locals(x, part)

    def _locals(self, x: I64, part: I64) -> I64:
        """Global sample ids of partition positions ``x`` (after mixing) of ``part``."""
        cfg = self.config
        item = (part * self.partition_size + x) % self.num_samples
        span = np.searchsorted(self._span_start, item, side="right") - 1
        j = item - self._span_start[span]
        shard = self._spans.shard[span]
        n = self.shard_sizes[shard]
        local = (self._spans.rot[span] + j) % n
        if cfg.shuffle:
            local = permute(local, n, self._spans.key[span])
        out: I64 = self.shard_starts[shard] + local
        return out

    def rank_layout(self, rank: int, world_size: int) -> tuple[I64, I64, I64]:
        """``(parts, lo, hi)``: the partitions ``rank``'s slice touches, in order, and its
        slot range ``[lo, hi)`` inside each of them.

        A global batch is the partitions' ``q = B / P`` slots laid end to end (partition
        major); rank ``r`` of ``W`` reads the contiguous slots ``[r B / W, (r+1) B / W)``.
        When ``W`` divides ``P`` that is whole partitions, when ``P`` divides ``W`` an equal
        part of one, and otherwise whole partitions plus a part of one at either end: any
        world size dividing ``B`` reads the same global batches.
        """
        self.config.check_world_size(world_size)
        if not 0 <= rank < world_size:
            raise PlanError(f"rank={rank} is outside 0 .. world_size-1 = {world_size - 1}")
        q = self.config.partition_batch_size
        per = self.config.global_batch_size // world_size
        start, stop = rank * per, (rank + 1) * per
        parts = np.arange(start // q, (stop - 1) // q + 1, dtype=np.int64)
        lo = np.maximum(parts * q, start) - parts * q
        hi = np.minimum((parts + 1) * q, stop) - parts * q
        return parts, lo, hi

    def _check_batch(self, b: int) -> None:
        if not 0 <= b < self.num_batches:
            raise PlanError(f"batch {b} is outside 0 .. num_batches-1 = {self.num_batches - 1}")

    def rank_batch(self, b: int, rank: int, world_size: int) -> I64:
        """Global sample ids of ``rank``'s part of global batch ``b`` (``B / world_size``).

        Computes the aligned run of ``_CHUNK`` batches around ``b`` in one vectorized call
        and keeps the last few runs: numpy's per-call overhead dominates a single small
        batch, and readers ask for nearby batches next.
        """
        self._check_batch(b)
        key = (rank, world_size, b // _CHUNK)
        run = self._runs.get(key)
        if run is None:
            first = key[2] * _CHUNK
            run = self.rank_batches(
                np.arange(first, min(first + _CHUNK, self.num_batches)), rank, world_size
            )
            if len(self._runs) >= _RUNS_KEPT:
                # Threads may race here; losing a cache entry is harmless, raising is not.
                with contextlib.suppress(StopIteration, RuntimeError):
                    self._runs.pop(next(iter(self._runs)), None)
            self._runs[key] = run
        out: I64 = run[b % _CHUNK].copy()
        return out

    def rank_batches(self, batches: ArrayLike, rank: int, world_size: int) -> I64:
        """Several of ``rank``'s batches at once, shape ``(len(batches), B / world_size)``.

        One vectorized evaluation: a loader worker computing its next dozens of batches in
        one call pays numpy's per-call overhead once instead of per batch.
        """
        bs = np.asarray(batches, dtype=np.int64).reshape(-1)
        if bs.size and (bs.min() < 0 or bs.max() >= self.num_batches):
            bad = bs[(bs < 0) | (bs >= self.num_batches)][0]
            self._check_batch(int(bad))
        self.rank_layout(rank, world_size)  # validates rank and world size
        q = self.config.partition_batch_size
        per = self.config.global_batch_size // world_size
        slot = np.arange(rank * per, (rank + 1) * per, dtype=np.int64)  # in the global batch
        shape = (bs.size, per)
        t = bs[:, None] * q + (slot % q)[None, :]
        part = np.broadcast_to((slot // q)[None, :], shape).ravel()
        ids = self._items(part, np.broadcast_to(t, shape).ravel())
        return ids.reshape(shape)

    def iter_rank_batches(
        self, rank: int, world_size: int, batches: Sequence[int], chunk: int = 64
    ) -> Iterator[tuple[int, I64]]:
        """``(b, ids)`` for each ``b`` in ``batches`` (e.g. ``worker_batches(...)``), computed
        ``chunk`` batches per vectorized call: the fast way for a loader to walk its batches.
        """
        for i in range(0, len(batches), chunk):
            sel = np.asarray(batches[i : i + chunk], dtype=np.int64)
            yield from zip(sel.tolist(), self.rank_batches(sel, rank, world_size), strict=True)

    def global_batches(self, start: int, stop: int) -> I64:
        """Ids of global batches ``start .. stop-1`` concatenated (each in rank order)."""
        if not 0 <= start <= stop <= self.num_batches:
            raise PlanError(f"batch range {start}:{stop} is outside 0:{self.num_batches}")
        p, q = self.config.num_partitions, self.config.partition_batch_size
        b = np.arange(start, stop, dtype=np.int64)[:, None, None]
        t = b * q + np.arange(q, dtype=np.int64)[None, None, :]
        part = np.broadcast_to(np.arange(p, dtype=np.int64)[None, :, None], (stop - start, p, q))
        return self._items(part.ravel(), np.broadcast_to(t, part.shape).ravel())

    def worker_batches(self, start_batch: int, worker: int, num_workers: int) -> range:
        """Global batches a DataLoader worker reads: ``start_batch + worker`` then every
        ``num_workers``-th, so the loader's round-robin yields them in order from any resume
        point."""
        if not 0 <= worker < num_workers:
            raise PlanError(f"worker={worker} is outside 0 .. num_workers-1 = {num_workers - 1}")
        return range(start_batch + worker, self.num_batches, num_workers)

    # ---- shards --------------------------------------------------------------------------
    def rank_schedule(
        self, rank: int, world_size: int, start_batch: int = 0
    ) -> tuple[I64, I64, I64]:
        """``(shards, first, last)``: the shards ``rank`` reads from ``start_batch`` on, in
        need order, each with the first and last global batch that may read it.

        Exact up to window granularity: a shard is read only in batches ``first .. last``
        (a repeated shard may have gaps in between). A cache can fetch a shard shortly
        before ``first`` and let it go after ``last``.
        """
        if start_batch != self.num_batches:
            self._check_batch(start_batch)
        parts, lo, _ = self.rank_layout(rank, world_size)
        return rank_schedule(self._view(), parts, lo, start_batch)

    def _view(self) -> PlanView:
        return PlanView(
            span_start=self._span_start,
            span_shard=self._spans.shard,
            num_samples=self.num_samples,
            num_batches=self.num_batches,
            partition_size=self.partition_size,
            partition_batch_size=self.config.partition_batch_size,
            block=self.block if self.config.shuffle else 1,
        )

    def rank_shard_shares(self, rank: int, world_size: int) -> tuple[I64, NDArray[np.float64]]:
        """``(shards, share)``: the shards ``rank`` reads over the epoch and the fraction of
        each one's samples it reads (1.0: all of them). A cache fills a shard whole only
        where the rank reads a good part of it."""
        parts, lo, hi = self.rank_layout(rank, world_size)
        shards, items = rank_shard_items(self._view(), parts, lo, hi)
        sizes = np.diff(self.shard_starts)[shards]
        return shards, np.minimum(items / np.maximum(sizes, 1), 1.0)

    def rank_shards(self, rank: int, world_size: int, start_batch: int = 0) -> I64:
        """Global shard indices ``rank`` reads from ``start_batch`` on, in need order.

        The order is by the batch at which a shard is first needed (a superset at the
        window edges: the whole window containing ``start_batch`` is included). A shard
        read by several spans (repeats, padding) is listed once, at its first need.
        """
        return self.rank_schedule(rank, world_size, start_batch)[0]

    def locate(self, ids: ArrayLike) -> tuple[I64, I64]:
        """Split global sample ids into (global shard index, index inside that shard)."""
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.total_samples):
            raise PlanError(f"sample ids must lie in 0 .. {self.total_samples - 1}")
        shard = np.searchsorted(self.shard_starts, arr, side="right") - 1
        return shard.astype(np.int64), arr - self.shard_starts[shard]
