"""One process's view of the epoch: which batches it builds and how.

:class:`BatchStream` ties the pieces together for one rank: the epoch plan (which global
sample ids make up this rank's share of global batch ``b``), the read path
(:class:`~shardstream.client.reads.reads.ShardReads`: the shards' bytes, driven by
``start_pass``, ``want`` and ``need``), and the batch builder (one gather per shard run).
It is shared by the :class:`~shardstream.client.StreamingDataset` (inside DataLoader
workers) and the :class:`~shardstream.client.ShardstreamLoader` workers. Processes never
talk to each other: each derives its batches from the plan alone.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from shardstream.client.batches.batch import Allocator, BatchBuilder, ColumnSpec, numpy_allocator
from shardstream.client.batches.decode import to_torch
from shardstream.client.batches.image_decode import ImageDecoder
from shardstream.client.batches.packed import Packer
from shardstream.client.batches.sample_transform import SampleStage, SampleTransform
from shardstream.client.batches.step_tokens import tokens_per_step
from shardstream.client.distributed import Topology
from shardstream.client.options import CacheOptions, PackOptions, PlanOptions, ReadOptions
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.memory_need import window_need_bytes
from shardstream.client.reads.reads import ReadPass, ShardReads
from shardstream.client.sources.source import ResolvedSource
from shardstream.errors import ConfigError, PlanError
from shardstream.plan import (
    PLAN_ALGORITHM,
    AnyPlan,
    MixtureSchedule,
    PlanConfig,
    SourceSpec,
    check_schedule,
    default_shape,
    make_plan,
    plan_fingerprint,
)
from shardstream.wire import PlanParams, SourceMixture

__all__ = ["BatchStream", "BatchTransform"]

MAX_CHUNK = 8
"""Batches built per chunk at most (the plan is evaluated for 8 chunks at a time)."""

_Chunk = tuple[list[int], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]
"""A planned chunk of batches: (batch numbers, ids, shard, index in shard)."""

BatchTransform = Callable[[dict[str, Any]], dict[str, Any]]
"""A user function applied to every whole batch (column -> tensor) in the worker."""


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
        read: ReadOptions,
        spec: ColumnSpec,
        transform: BatchTransform | None = None,
        sample_transform: SampleTransform | None = None,
        pack: PackOptions | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.sources = list(sources)
        self.batch_size = batch_size
        self.topology = topology
        self.cache_options = cache
        self.read_options = read
        self.spec = spec
        self.transform = transform
        self.options = plan
        self.packer = None if pack is None else Packer(pack, spec, batch_size)
        """Read-time packing of each batch of documents (:mod:`packed`), if any."""
        self.samples = (
            None
            if sample_transform is None
            else SampleStage(
                sample_transform,
                encodings=spec.encodings,
                decoder=ImageDecoder.of(spec.options),
                seed=plan.seed,
            )
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
        if plan.schedule is not None:
            try:
                check_schedule(plan.schedule, self._specs)
            except PlanError as exc:
                raise ConfigError(f"PlanOptions.schedule: {exc}") from exc
        # The options, else a fresh run's defaults; a resume adopts the saved ones (accept).
        parts, window = default_shape(
            batch_size * topology.world_size, topology.world_size, self._specs
        )
        if plan.num_partitions is not None:  # the user's P: the plan's own window default
            parts, window = plan.num_partitions, None
        self.config = self._config(parts, plan.window or window)
        self.schedule = self._schedule()
        """The mixture schedule planned with (one in tokens knows the tokens of a step)."""
        self._shard_bytes = [info.raw_data.bytes for src in self.sources for info in src.shards]
        self._shard_samples = [info.samples for src in self.sources for info in src.shards]
        self._plan: AnyPlan | None = None
        self._fingerprint: tuple[PlanConfig, str] | None = None
        # Images stay bytes for a per-sample transform: it decodes them as (C, H, W).
        self._builder = BatchBuilder(
            spec, decode_images=spec.options.decode_images and self.samples is None
        )
        self._reads: ShardReads | None = None
        self._reads_pid = -1
        self.read_stats = BlockStats()
        """Ranged-read counters of this process (requests, bytes, corrupt blocks), kept
        across the read paths of successive epochs."""

    def _config(self, partitions: int, window: int | None) -> PlanConfig:
        opts = self.options
        config = PlanConfig(
            seed=opts.seed,
            global_batch_size=self.batch_size * self.topology.world_size,
            num_partitions=partitions,
            shuffle=opts.shuffle,
            tail=opts.tail,
            window=window,
            epoch_size=opts.epoch_size,
        )
        config.check_world_size(self.topology.world_size)
        return config

    def _schedule(self) -> MixtureSchedule | None:
        """The options' schedule; one in tokens with the tokens a global step consumes (a
        function of the global batch and the packing, never of the world size)."""
        schedule = self.options.schedule
        if schedule is None or not schedule.in_tokens:
            return schedule
        per_step = tokens_per_step(self.spec.encodings, self.packer, self.config.global_batch_size)
        try:
            return schedule.with_tokens_per_step(per_step)
        except PlanError as exc:
            raise ConfigError(f"PlanOptions.schedule: {exc}") from exc

    def adopt(self, config: PlanConfig, pack: Mapping[str, Any] | None) -> None:
        """Plan with ``config`` and the packing group ``pack`` from now on (what a resume
        state decides: :meth:`~shardstream.client.resume.ReaderResume.accept`)."""
        if config != self.config:
            self.config, self._plan = config, None
        if self.packer is not None:
            self.packer.adopt(pack)
            # The saved group may change a step's tokens: plan with the run's schedule.
            self.schedule, self._plan, self._fingerprint = self._schedule(), None, None

    def fingerprint(self) -> str:
        """:attr:`EpochPlan.fingerprint` of this stream's plans (the same for every epoch)."""
        if self._fingerprint is None or self._fingerprint[0] != self.config:
            digest = plan_fingerprint(PLAN_ALGORITHM, self.config, self._specs, self.schedule)
            self._fingerprint = (self.config, digest)
        return self._fingerprint[1]

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
        mixture = [
            SourceMixture(src.source.weight, src.source.repeat, src.source.samples)
            for src in self.sources
        ]
        # "schedule" and "pack" are absent without them: earlier states still match.
        return PlanParams(
            **asdict(self.config),
            mixture=mixture,
            schedule=None if self.schedule is None else self.schedule.to_params(),
            pack=None if self.packer is None else self.packer.params(),
        ).to_wire()

    def plan(self, epoch: int) -> AnyPlan:
        """The (cached) plan of ``epoch`` (a scheduled one under a mixture schedule)."""
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = make_plan(self._specs, self.config, epoch, self.schedule)
        return self._plan

    def num_batches(self, epoch: int) -> int:
        """Global batches in ``epoch`` (each rank reads its share of every one)."""
        return int(self.plan(epoch).num_batches)

    def reads(self) -> ShardReads:
        """This process's read path (a fresh one after a fork)."""
        if self._reads is None or self._reads_pid != os.getpid():
            if self._reads_pid != os.getpid():
                self.read_stats = BlockStats()  # counts of this process only
            self._reads = ShardReads(
                self.sources, self.cache_options, self.read_options, stats=self.read_stats
            )
            self._reads_pid = os.getpid()
        return self._reads

    def memory_need(self, epoch: int, start: int, step: int = 1) -> int:
        """Bytes the cacheless mode holds at most at once reading ``epoch`` from batch
        ``start`` (every ``step``-th batch): the shards of the mixing window, each from
        the look-ahead before its first batch to its last (:mod:`memory_need`)."""
        plan = self.plan(epoch)
        shards, first, last = plan.rank_schedule(
            self.topology.rank, self.topology.world_size, start
        )
        sizes = np.array([self._shard_bytes[int(s)] for s in shards.tolist()], dtype=np.int64)
        lead = self.read_options.read_ahead_batches * step + MAX_CHUNK * step
        return window_need_bytes(first, last, sizes, lead=lead)

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
        reads = self.reads()

        def memory() -> tuple[int, dict[int, int]]:
            shards, _, last = plan.rank_schedule(rank, world, start)
            last_of = dict(zip(shards.tolist(), last.tolist(), strict=True))
            return self.memory_need(epoch, start, step), last_of

        # The rank's shards in the order it needs them, from the resume point: prefetch
        # walks this list a few shards ahead of the furthest shard read so far.
        shards, shares = plan.rank_shard_shares(rank, world)
        order = plan.rank_shards(rank, world, start_batch=start)
        reads.start_pass(
            ReadPass(order=np.asarray(order), shards=shards, shares=shares.tolist(), memory=memory)
        )
        planned = _planned(plan, rank, world, start, step=step, max_chunk=max_chunk)
        # Chunks planned but not built yet: their samples' blocks are fetched ahead.
        window: deque[_Chunk] = deque()
        queued, first = 0, True
        read_ahead = self.read_options.read_ahead_batches
        for chunk in planned:
            reads.want(chunk[2], chunk[3], chunk[0])
            window.append(chunk)
            queued += len(chunk[0])
            # The first batch is built at once; later ones once the look-ahead is queued.
            while window and (first or queued > read_ahead):
                built = window.popleft()
                queued -= len(built[0])
                first = False
                yield self._build(reads, built, epoch=epoch, alloc=alloc)
        while window:
            yield self._build(reads, window.popleft(), epoch=epoch, alloc=alloc)

    def _build(
        self, reads: ShardReads, chunk: _Chunk, *, epoch: int, alloc: Allocator
    ) -> list[tuple[int, dict[str, Any]]]:
        """Build one planned chunk: ``[(b, batch), ...]``."""
        bs, ids, shards, local = chunk
        with reads.need(shards, local, bs) as reader:  # this chunk's own bytes, verified
            built = self._builder.build(
                shards,
                local,
                reader,
                sample_ids=ids if self.spec.options.sample_ids else None,
                alloc=alloc,
            )
        out = []
        for row, (b, batch) in enumerate(zip(bs, built, strict=True)):
            columns = batch
            if self.samples is not None:
                columns = self.samples.apply(
                    batch, epoch=epoch, batch_number=b, ids=ids[row].tolist(), alloc=alloc
                )
            if self.packer is not None:
                columns = self.packer.apply(
                    columns, alloc, where=self._document_at(ids[row], shards[row], local[row])
                )
            tensors = to_torch(columns)  # shares memory: no copy
            if self.transform is not None:
                tensors = self.transform(tensors)
            out.append((b, tensors))
        return out

    def _document_at(
        self, ids: np.ndarray[Any, Any], shards: np.ndarray[Any, Any], local: np.ndarray[Any, Any]
    ) -> Callable[[int], str]:
        """Names a batch's ``i``-th sample (its id, shard and index) for a packing error."""

        def where(i: int) -> str:
            shard = int(shards[i])
            for src in self.sources:
                if shard < len(src.shards):
                    name = f"{src.source.uri} shard {src.shards[shard].raw_data.basename}"
                    return f"sample {int(ids[i])} ({name}, sample {int(local[i])})"
                shard -= len(src.shards)
            return f"sample {int(ids[i])}"

        return where

    def __getstate__(self) -> dict[str, Any]:
        # Threads, leases and mappings belong to the process that made them.
        state = dict(self.__dict__)
        state["_reads"], state["_reads_pid"], state["_plan"] = None, -1, None
        state["read_stats"] = None  # holds a lock; the child counts its own reads
        return state

    def close(self, *, finish_fills_s: float = 0.0) -> None:
        """Release leases and download threads held by this process (after giving
        background cache fills up to ``finish_fills_s`` to finish)."""
        if self._reads is not None and self._reads_pid == os.getpid():
            self._reads.close(finish_fills_s=finish_fills_s)
        self._reads = None


def _planned(
    plan: AnyPlan, rank: int, world: int, start: int, *, step: int, max_chunk: int
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
