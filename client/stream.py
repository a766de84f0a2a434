"""One process's view of the epoch: which batches it builds and how.

:class:`BatchStream` ties the pieces together for one rank: the epoch plan (which global
sample ids make up this rank's share of global batch ``b``), the shard fetcher (prefetch,
lease, memory-map), and the batch builder (one gather per shard run). It is shared by the
:class:`~shardstream.client.StreamingDataset` (inside DataLoader workers) and the
:class:`~shardstream.client.ShardstreamLoader` workers. Processes never talk to each
other: each derives its batches from the plan alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from shardstream.client.batch import Allocator, BatchBuilder, ColumnSpec, numpy_allocator
from shardstream.client.decode import to_torch
from shardstream.client.distributed import Topology
from shardstream.client.fetch import ShardFetcher
from shardstream.client.options import CacheOptions, PlanOptions
from shardstream.client.plan import EpochPlan, PlanConfig, SourceSpec
from shardstream.client.source import ResolvedSource
from shardstream.client.state import ReaderState
from shardstream.errors import ConfigError, PlanError, ResumeError

__all__ = ["BatchStream", "BatchTransform", "default_partitions"]

MAX_CHUNK = 8
"""Batches built per chunk at most (the plan is evaluated for 8 chunks at a time)."""


BatchTransform = Callable[[dict[str, Any]], dict[str, Any]]
"""A user function applied to every whole batch (column -> tensor) in the worker."""


def default_partitions(global_batch_size: int, world_size: int) -> int:
    """The default canonical partition count of a fresh run.

    The largest divisor of the global batch size up to ``max(8, world_size)`` that the world
    size divides or is divided by. Partitions are the unit of elastic resume (a later world
    size must divide ``P`` or be a multiple of it) and of locality (a rank reads only its
    partitions' shards); a few per rank keep both, without spreading every batch over more
    partitions than needed.
    """
    cap = max(8, world_size)
    return max(
        p
        for p in range(1, min(cap, global_batch_size) + 1)
        if global_batch_size % p == 0 and (p % world_size == 0 or world_size % p == 0)
    )


class BatchStream:
    """Builds this rank's batches of any epoch, from any position, in this process."""

    def __init__(
        self,
        sources: Sequence[ResolvedSource],
        batch_size: int,
        *,
        topology: Topology,
        plan: PlanOptions,
        cache: CacheOptions,
        spec: ColumnSpec,
        transform: BatchTransform | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.sources = list(sources)
        self.batch_size = batch_size
        self.topology = topology
        self.cache_options = cache
        self.spec = spec
        self.transform = transform
        self.options = plan
        global_batch = batch_size * topology.world_size
        self.config = self._config(
            plan.num_partitions or default_partitions(global_batch, topology.world_size)
        )
        self._specs = [
            SourceSpec(
                shard_sizes=np.array([s.samples for s in src.shards], dtype=np.int64),
                weight=src.source.weight,
                repeat=src.source.repeat,
                count=src.source.samples,
                name=src.source.uri,
            )
            for src in self.sources
        ]
        self._plan: EpochPlan | None = None
        self._builder = BatchBuilder(spec)
        self._fetcher: ShardFetcher | None = None
        self._fetcher_pid = -1

    def _config(self, partitions: int) -> PlanConfig:
        opts = self.options
        config = PlanConfig(
            seed=opts.seed,
            global_batch_size=self.batch_size * self.topology.world_size,
            num_partitions=partitions,
            shuffle=opts.shuffle,
            tail=opts.tail,
            window=opts.window,
            epoch_size=opts.epoch_size,
        )
        config.check_world_size(self.topology.world_size)
        return config

    def accept(self, state: ReaderState) -> None:
        """Check that ``state`` can resume this stream; adopt its partition count unless
        the user fixed one (:class:`ResumeError` naming the mismatch otherwise)."""
        saved = state.plan.get("num_partitions")
        if (
            self.options.num_partitions is None
            and isinstance(saved, int)
            and saved != self.config.num_partitions
        ):
            try:
                self.config = self._config(saved)
            except PlanError as exc:
                raise ResumeError(f"cannot resume with this world size: {exc}") from exc
            self._plan = None
        state.check_compatible(self.plan_params(), self.versions)

    @property
    def versions(self) -> tuple[str, ...]:
        """Version ids of the sources, in order."""
        return tuple(src.version_id for src in self.sources)

    @property
    def weights(self) -> tuple[float | None, ...]:
        """Mixture weights of the sources, in order."""
        return tuple(src.source.weight for src in self.sources)

    def plan_params(self) -> dict[str, Any]:
        """The plan parameters a resume state must match."""
        params = asdict(self.config)
        params["mixture"] = [
            [src.source.weight, src.source.repeat, src.source.samples] for src in self.sources
        ]
        return params

    def plan(self, epoch: int) -> EpochPlan:
        """The (cached) plan of ``epoch``."""
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = EpochPlan(sources=self._specs, config=self.config, epoch=epoch)
        return self._plan

    def num_batches(self, epoch: int) -> int:
        """Global batches in ``epoch`` (each rank reads its share of every one)."""
        return int(self.plan(epoch).num_batches)

    def fetcher(self) -> ShardFetcher:
        """This process's shard fetcher (a fresh one after a fork)."""
        if self._fetcher is None or self._fetcher_pid != os.getpid():
            self._fetcher = ShardFetcher(self.sources, self.cache_options)
            self._fetcher_pid = os.getpid()
        return self._fetcher

    def batches(
        self, epoch: int, start: int, step: int = 1, *, alloc: Allocator = numpy_allocator
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(b, batch)`` for batches ``start, start + step, ...`` of ``epoch``.

        A batch maps column names to tensors of shape ``(batch_size, ...)`` (lists for
        variable-size values), after the user transform.
        """
        for chunk in self.chunks(epoch, start, step, alloc=alloc):
            yield from chunk

    def chunks(
        self,
        epoch: int,
        start: int,
        step: int = 1,
        *,
        alloc: Allocator = numpy_allocator,
        max_chunk: int = MAX_CHUNK,
    ) -> Iterator[list[tuple[int, dict[str, Any]]]]:
        """The same batches, built a chunk at a time (1, 2, 4, ... up to ``max_chunk``
        batches): one gather per shard run per chunk. ``alloc`` places each chunk's arrays;
        a chunk's batches are views of them."""
        plan = self.plan(epoch)
        rank, world = self.topology.rank, self.topology.world_size
        fetcher = self.fetcher()
        # The rank's shards in the order it needs them, from the resume point: prefetch
        # walks this list a few shards ahead of the furthest shard read so far.
        order = np.asarray(plan.rank_shards(rank, world, start_batch=start), dtype=np.int64)
        where = {int(s): i for i, s in enumerate(order.tolist())}
        ahead = self.cache_options.prefetch_shards
        cursor = -1
        fetcher.prefetch(order[: ahead + 1])
        for bs, ids, shards, local in _planned(
            plan, rank, world, start, step=step, max_chunk=max_chunk
        ):
            needed = np.unique(shards).tolist()
            fetcher.prefetch(needed)  # parallel downloads for a chunk spanning cold shards
            built = self._builder.build(
                shards,
                local,
                fetcher.reader,
                sample_ids=ids if self.spec.options.sample_ids else None,
                alloc=alloc,
            )
            furthest = max(where.get(s, -1) for s in needed)
            if furthest > cursor:
                cursor = furthest
                if ahead:
                    fetcher.prefetch(order[cursor + 1 : cursor + 1 + ahead])
            fetcher.release_unused(set(needed))
            out = []
            for b, batch in zip(bs, built, strict=True):
                tensors = to_torch(batch)  # shares memory: no copy
                if self.transform is not None:
                    tensors = self.transform(tensors)
                out.append((b, tensors))
            yield out

    def __getstate__(self) -> dict[str, Any]:
        # Threads, leases and mappings belong to the process that made them.
        state = dict(self.__dict__)
        state["_fetcher"], state["_fetcher_pid"], state["_plan"] = None, -1, None
        return state

    def close(self) -> None:
        """Release leases and download threads held by this process."""
        if self._fetcher is not None and self._fetcher_pid == os.getpid():
            self._fetcher.close()
        self._fetcher = None


def _planned(
    plan: EpochPlan, rank: int, world: int, start: int, *, step: int, max_chunk: int
) -> Iterator[tuple[list[int], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """``(batch numbers, ids, shard, index in shard)`` of chunks of batches ``start, start +
    step, ...``, each array shaped ``(len(chunk), rank batch size)``.

    The plan is evaluated for many batches per numpy call (its per-call overhead dwarfs the
    arithmetic of one batch). Chunks start at one batch, so the first batch is not delayed,
    and double up to ``max_chunk``.
    """
    todo = range(start, plan.num_batches, step)
    pos, chunk = 0, 1
    while pos < len(todo):
        size = 1 if pos == 0 else 8 * max_chunk  # first batch fast, then amortized
        sel = np.asarray(todo[pos : pos + size], dtype=np.int64)
        ids = np.asarray(plan.rank_batches(sel, rank, world), dtype=np.int64)
        shard, local = plan.locate(ids.reshape(-1))
        shard = np.asarray(shard, dtype=np.int64).reshape(ids.shape)
        local = np.asarray(local, dtype=np.int64).reshape(ids.shape)
        at = 0
        while at < len(sel):
            take = min(chunk, len(sel) - at)
            part = slice(at, at + take)
            yield sel[part].tolist(), ids[part], shard[part], local[part]
            at += take
            chunk = min(chunk * 2, max_chunk)
        pos += len(sel)
