"""ShardReads: the one owner of a process's read path, and the batch stream's contract with it.

A :class:`ShardReads` lives in one process (the main process or one worker) and brings
shard bytes into it. It is composed of explicit parts over one explicit shared state
(:class:`~shardstream.client.reads.read_state.SharedReads`):

- :class:`~shardstream.client.reads.demand.BlockDemand` -- the blocks (or pieces) the next
  batches need, fetched first and waited for;
- :class:`~shardstream.client.reads.fills.ShardFills` -- whole downloads, fills of the
  cache's download file, memory-held shards;
- :class:`~shardstream.client.reads.leases.ShardLeases` -- shards leased from the node
  cache and opened, and the downloads that run ahead of them;
- the memory-held shards (:class:`~shardstream.client.reads.memory.MemoryShards`) and the
  node's memory peers (:class:`~shardstream.client.reads.peer_files.MemoryPeers`), in the shared
  state since every part uses them.

How each shard is read (whole, ranged, sparse, by piece) and the cold-start rules are
decided by :mod:`~shardstream.client.reads.policy`, which does no I/O.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.options import CacheOptions, ReadOptions
from shardstream.client.reads.catalog import ShardCatalog
from shardstream.client.reads.demand import BlockDemand
from shardstream.client.reads.fills import ShardFills
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.leases import ShardLeases
from shardstream.client.reads.memory_need import check_memory_need
from shardstream.client.reads.policy import ShardFacts, fills_now, light_shards
from shardstream.client.reads.read_state import SharedReads
from shardstream.client.sources.source import ResolvedSource
from shardstream.mds import ShardReader

__all__ = ["ReadPass", "ShardReads"]

I64 = np.ndarray[Any, Any]


@dataclass(frozen=True)
class ReadPass:
    """What the read path needs to know of one pass of this rank over an epoch, from its
    resume point (all from the epoch plan)."""

    order: I64
    """The rank's shards in the order it first needs them (``EpochPlan.rank_shards``)."""
    shards: I64
    """The shards the rank reads this epoch, and ..."""
    shares: Sequence[float]
    """... the share of each one's samples it reads (``EpochPlan.rank_shard_shares``)."""
    memory: Callable[[], tuple[int, dict[int, int]]]
    """Cacheless mode: the bytes the window holds at most at once, and each shard's last
    batch (``EpochPlan.rank_schedule``); asked only in that mode."""


@dataclass
class _Progress:
    """Where a pass stands: the prefetch cursor in ``order`` and the first chunk."""

    order: I64
    where: dict[int, int]
    cursor: int = -1
    first_built: bool = False


class ShardReads:
    """The read path of one process: shards' bytes for the batch stream.

    The contract, in this order (each call may be repeated as shown)::

        reads = ShardReads(sources, cache, read)
        reads.start_pass(ReadPass(...))              # an epoch pass from its resume point
        for each chunk of batches, in plan order:
            reads.want(shards, local, batches)        # look-ahead: returns at once
            ...                                       # (further chunks' wants)
            with reads.need(shards, local, batches) as reader:   # waits for its bytes
                build the chunk from reader(shard)    # a ShardReader for each shard
        reads.close(finish_fills_s=...)               # leases, threads, memory

    ``start_pass`` may come again for the next pass (an epoch, a resume). Every chunk is
    wanted before it is needed, and needed in the order wanted; ``need`` fetches whole
    shards, starts the background fills once the pass's first chunk is built
    (:func:`~.policy.fills_now`) and, when the block closes, prefetches the next shards in
    ``order`` and releases leases the chunk no longer needs.
    """

    def __init__(
        self,
        sources: Sequence[ResolvedSource],
        cache: CacheOptions,
        read: ReadOptions,
        *,
        stats: BlockStats | None = None,
    ) -> None:
        self.shared = SharedReads(
            catalog=ShardCatalog(sources),
            options=read,
            cache=None
            if read.memory_only
            else ShardCache(cache.root, limit_bytes=cache.limit_bytes),
            open_shards=cache.open_shards,
            stats=stats if stats is not None else BlockStats(),
        )
        self.fills = ShardFills(self.shared)
        self.leases = ShardLeases(self.shared, self.fills)
        self.demand = BlockDemand(self.shared, self.fills, self.leases)
        self._pass: _Progress | None = None
        # Dropped without close() (a stream whose pass was abandoned, a dataset let go),
        # the path still stops its threads, releases its leases and frees its memory
        # files: its idle threads would otherwise keep all of it (and the store's
        # connections) for the life of the process.
        self._finalizer = weakref.finalize(self, _release, os.getpid(), self.leases, self.shared)
        self._finalizer.atexit = False  # at exit the process frees all of it anyway

    @property
    def stats(self) -> BlockStats:
        """This process's read counters."""
        return self.shared.stats

    def start_pass(self, plan: ReadPass) -> None:
        """Start a pass: which shards are read lightly (never filled: blocks of the
        previous pass's light shards are freed), the cacheless memory check (before any
        read: :class:`ConfigError` if the budget is below the window's need), and the
        first shards' whole downloads and (cacheless) headers; no background fill yet."""
        shared = self.shared
        catalog = shared.catalog
        light = light_shards(
            plan.shards.tolist(), list(plan.shares), lambda s: ShardFacts.of(catalog.info(s))
        )
        shared.start_pass(light)
        if shared.cacheless:  # refuse a budget that would thrash, before reads
            need, last = plan.memory()
            check_memory_need(shared.options.memory_budget_bytes, need)
            shared.memory_shards().schedule(last)
        order = np.asarray(plan.order, dtype=np.int64)
        self._pass = _Progress(order, {int(s): i for i, s in enumerate(order.tolist())})
        # Before the first batch, fetch only what it needs: its blocks, whole shards that
        # cannot be ranged, and (cacheless) headers; background fills start after it.
        self.leases.prefetch(order[: shared.options.prefetch_shards + 1], fills=False)

    def want(self, shards: I64, local: I64, batches: Sequence[int] | None = None) -> None:
        """Start fetching what samples ``local[i]`` of ``shards[i]`` (of batches
        ``batches``) need; returns at once."""
        self.demand.want(shards, local, batches)

    @contextlib.contextmanager
    def need(
        self, shards: I64, local: I64, batches: Sequence[int] | None = None
    ) -> Iterator[Callable[[int], ShardReader]]:
        """Wait until samples ``local[i]`` of ``shards[i]`` are here; yields ``reader``, the
        :class:`ShardReader` of each of the chunk's shards. Closing the block says that
        the chunk is built: the next shards are prefetched and unused leases released."""
        progress = self._pass
        if progress is None:
            raise RuntimeError("ShardReads.need before start_pass")
        ahead = self.shared.options.prefetch_shards
        needed = np.unique(shards).tolist()
        fills = fills_now(progress.first_built)
        self.leases.prefetch(needed, fills=fills)  # parallel downloads for a chunk on cold shards
        ready = self.demand.need(shards, local, batches)  # ranged: this chunk's own blocks

        def reader(shard: int) -> ShardReader:
            found = ready.get(shard)
            return found if found is not None else self.leases.reader(shard)

        yield reader
        furthest = max(progress.where.get(s, -1) for s in needed)
        if furthest > progress.cursor:
            progress.cursor = furthest
            if ahead:
                nxt = progress.order[furthest + 1 : furthest + 1 + ahead]
                self.leases.prefetch(nxt, fills=fills)
        self.leases.release_unused(set(needed))
        if not progress.first_built:
            progress.first_built = True
            self.leases.prefetch(progress.order[: max(progress.cursor, 0) + ahead + 1])

    def close(self, *, finish_fills_s: float = 0.0) -> None:
        """Release every lease, stop the download threads, free memory-held shards.

        ``finish_fills_s`` > 0 (an epoch that ended normally) first gives background fills
        that long to land in the cache: by then the epoch has fetched nearly every block,
        so what is left is a few blocks and the whole-shard check, and a fill failed here
        would be fetched again next epoch.
        """
        self.leases.close(finish_fills_s=finish_fills_s)
        self.shared.close()


def _release(pid: int, leases: ShardLeases, shared: SharedReads) -> None:
    """Close a read path that was dropped unclosed, in the process that made it (a
    forked child's copy holds nothing of its own).

    On a thread of its own: the collector may drop the path on any thread, one of the
    path's own (which ``close`` waits for) or one holding a lock that ``close`` takes.
    """
    if os.getpid() != pid:
        return

    def close() -> None:
        leases.close()
        shared.close()

    threading.Thread(target=close, name="shardstream-reads-close", daemon=True).start()
