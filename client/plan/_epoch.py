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
4. **Mixing.** Partition positions ``t`` are cut into blocks of ``window``; inside a block a
   seeded bijection (per seed, epoch, partition, block) maps positions to items, so every
   batch draws from all shards of its window.
5. **Batches.** Global batch ``b`` = for each partition, positions ``b q .. b q + q - 1``
   (``q = B / P``). Rank ``r`` of ``W`` takes whole partitions (``W | P``) or an equal slot
   range of one (``P | W``): a rank's batch is a slice of the global batch for every ``W``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardstream.client.plan._bijection import derive_key, keys_for, permute
from shardstream.client.plan._config import PlanConfig, SourceSpec
from shardstream.client.plan._mixture import SpanTable, build_spans, source_totals
from shardstream.client.plan._state import PlanState
from shardstream.errors import PlanError, ResumeError

I64 = NDArray[np.int64]

_TAG_SPANS = 11
_TAG_BLOCKS = 12
_DEFAULT_WINDOW_SHARDS = 8


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
        sizes = np.concatenate([s.shard_sizes for s in self.sources])
        self.shard_sizes: I64 = sizes
        self.shard_starts: I64 = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.source_shard_offsets: I64 = np.cumsum([0] + [s.shard_sizes.size for s in sources])
        self.source_totals = source_totals(self.sources, config)
        spans = build_spans(self.sources, config, self.epoch, self.source_totals)
        if config.shuffle and len(spans) > 1:
            key = derive_key(config.seed, self.epoch, _TAG_SPANS)
            order = permute(np.arange(len(spans)), len(spans), key)
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
        self._block_key = derive_key(config.seed, self.epoch, _TAG_BLOCKS)

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
        h = hashlib.sha256(repr(self.config).encode())
        for s in self.sources:
            h.update(repr((s.name, s.weight, s.repeat, s.count)).encode())
            h.update(np.ascontiguousarray(s.shard_sizes, dtype="<i8").tobytes())
        return h.hexdigest()[:32]

    def state(self, batches: int) -> PlanState:
        """The resume state after ``batches`` global batches of this epoch."""
        if not 0 <= batches <= self.num_batches:
            raise PlanError(f"batches={batches} is outside 0 .. {self.num_batches}")
        return PlanState(self.epoch, batches, self.config.global_batch_size, self.fingerprint)

    def resume_batch(self, state: PlanState) -> int:
        """The first global batch to read when resuming ``state`` with this plan (O(1)).

        Raises :class:`ResumeError` when the state was made with other sources, versions or
        plan parameters, for another epoch, or past this epoch's end.
        """
        if state.fingerprint != self.fingerprint:
            raise ResumeError(
                f"resume state was made with a different plan (fingerprint "
                f"{state.fingerprint} != {self.fingerprint}): sources, versions, weights, "
                f"seed, global_batch_size, num_partitions, shuffle, tail, window and "
                f"epoch_size must all match the interrupted run"
            )
        if state.epoch != self.epoch:
            raise ResumeError(f"resume state is for epoch {state.epoch}, plan is {self.epoch}")
        if state.batches > self.num_batches:
            raise ResumeError(
                f"resume state is at batch {state.batches}, past the epoch's "
                f"{self.num_batches} batches"
            )
        return state.batches

    # ---- the order -----------------------------------------------------------------------
    def _items(self, part: I64, t: I64) -> I64:
        """Global sample ids at positions ``t`` of partitions ``part`` (vectorized)."""
        cfg = self.config
        if cfg.shuffle:
            w = self.window
            block = t // w
            begin = block * w
            length = np.minimum(w, self.partition_size - begin)
            x = begin + permute(t - begin, length, keys_for(self._block_key, part, block))
        else:
            x = t
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

    def rank_layout(self, rank: int, world_size: int) -> tuple[I64, int, int]:
        """Partitions of ``rank`` and its slot range ``[lo, hi)`` inside each of them."""
        self.config.check_world_size(world_size)
        if not 0 <= rank < world_size:
            raise PlanError(f"rank={rank} is outside 0 .. world_size-1 = {world_size - 1}")
        p, q = self.config.num_partitions, self.config.partition_batch_size
        if world_size <= p:
            per = p // world_size
            return np.arange(rank * per, (rank + 1) * per, dtype=np.int64), 0, q
        k = world_size // p
        sub = q // k
        part = np.array([rank // k], dtype=np.int64)
        return part, (rank % k) * sub, (rank % k + 1) * sub

    def _check_batch(self, b: int) -> None:
        if not 0 <= b < self.num_batches:
            raise PlanError(f"batch {b} is outside 0 .. num_batches-1 = {self.num_batches - 1}")

    def rank_batch(self, b: int, rank: int, world_size: int) -> I64:
        """Global sample ids of ``rank``'s part of global batch ``b`` (``B / world_size``)."""
        out: I64 = self.rank_batches(np.array([b]), rank, world_size)[0]
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
        parts, lo, hi = self.rank_layout(rank, world_size)
        q = self.config.partition_batch_size
        slots = np.arange(lo, hi, dtype=np.int64)
        shape = (bs.size, parts.size, slots.size)
        t = bs[:, None, None] * q + slots[None, None, :]
        part = np.broadcast_to(parts[None, :, None], shape).ravel()
        ids = self._items(part, np.broadcast_to(t, shape).ravel())
        return ids.reshape(bs.size, parts.size * slots.size)

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
    def _spans_between(self, a: int, b: int) -> tuple[I64, I64]:
        """Spans touching extended items ``[a, b)`` and where each touch begins."""
        m = self.num_samples
        spans: list[I64] = []
        starts: list[I64] = []
        while a < b:
            base = (a // m) * m
            lo, hi = a - base, min(b - base, m)
            first = int(np.searchsorted(self._span_start, lo, side="right")) - 1
            last = int(np.searchsorted(self._span_start, hi - 1, side="right")) - 1
            idx = np.arange(first, last + 1, dtype=np.int64)
            spans.append(idx)
            starts.append(base + np.maximum(self._span_start[idx], lo))
            a = base + hi
        return np.concatenate(spans), np.concatenate(starts)

    def rank_shards(self, rank: int, world_size: int, start_batch: int = 0) -> I64:
        """Global shard indices ``rank`` reads from ``start_batch`` on, in need order.

        The order is by the batch at which a shard is first needed (a superset at the
        window edges: the whole window containing ``start_batch`` is included). A shard
        read by several spans (repeats, padding) is listed once, at its first need.
        """
        if start_batch == self.num_batches:
            return np.zeros(0, dtype=np.int64)
        self._check_batch(start_batch)
        parts, lo, _ = self.rank_layout(rank, world_size)
        q, s = self.config.partition_batch_size, self.partition_size
        w = self.window if self.config.shuffle else 1
        need: list[I64] = []
        shards: list[I64] = []
        for p in parts.tolist():
            x0 = (start_batch * q + lo) // w * w
            spans, starts = self._spans_between(p * s + x0, (p + 1) * s)
            x = starts - p * s
            need.append(np.maximum((x // w * w) // q, start_batch))
            shards.append(self._spans.shard[spans])
        need_all, shard_all = np.concatenate(need), np.concatenate(shards)
        order = np.argsort(need_all, kind="stable")
        shard_all = shard_all[order]
        _, first = np.unique(shard_all, return_index=True)
        return shard_all[np.sort(first)]

    def locate(self, ids: ArrayLike) -> tuple[I64, I64]:
        """Split global sample ids into (global shard index, index inside that shard)."""
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.total_samples):
            raise PlanError(f"sample ids must lie in 0 .. {self.total_samples - 1}")
        shard = np.searchsorted(self.shard_starts, arr, side="right") - 1
        return shard.astype(np.int64), arr - self.shard_starts[shard]
