"""The state the parts of one process's read path share, and its one lock.

:class:`~shardstream.client.reads.reads.ShardReads` is composed of parts (demand, fills,
leases) over one :class:`SharedReads`: the catalog of shards
(:class:`~.catalog.ShardCatalog`), the options, the node cache, the counters, the node's
peer files, the range queue and the memory-held shards (both made on first use), each
shard's read mode, and the state of this process's cache fills
(:class:`~.fill_states.FillStates`, changed only by its named transitions).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.options import ReadOptions
from shardstream.client.reads.catalog import ShardCatalog
from shardstream.client.reads.fill_states import FillStates
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.memory import MemoryShards
from shardstream.client.reads.peer_files import MemoryPeers
from shardstream.client.reads.policy import (
    LightShards,
    ReadMode,
    ShardFacts,
    mode_of,
    reads_ranged,
)
from shardstream.client.reads.queue import RangeQueue
from shardstream.client.sources.source import ResolvedSource

__all__ = ["SharedReads", "source_connections"]


@dataclass
class SharedReads:
    """The state the parts of one process's read path share (see the module docstring).

    Invariant: the catalog, options, cache, counters and peers never change; the fills'
    state changes only through :attr:`fill_states` (its own lock); :attr:`light` only through
    :meth:`start_pass`; the queue and the memory-held shards are made once, under the
    private lock. The parts take no lock of each other.
    """

    catalog: ShardCatalog
    options: ReadOptions
    cache: ShardCache | None
    """The node cache (``None``: cacheless, ``memory_only``)."""
    open_shards: int
    """Shards kept leased and open (``CacheOptions.open_shards``)."""
    stats: BlockStats
    peers: MemoryPeers = field(default_factory=MemoryPeers)
    """The node's other reading processes' memory files (they read each other's blocks)."""
    fill_states: FillStates = field(default_factory=FillStates)
    """This process's fills of the node cache's download files: scheduled by the leases,
    run by the fills, read by the demand."""
    light: LightShards = field(default_factory=LightShards)
    """The current pass's shards read by piece or sparsely (:func:`~.policy.light_shards`)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ranged: dict[int, bool] = field(default_factory=dict)
    _queue: RangeQueue | None = None
    _memory: MemoryShards | None = None

    @property
    def memory(self) -> MemoryShards | None:
        """The memory-held shards, if any were made."""
        return self._memory

    @property
    def cacheless(self) -> bool:
        """Whether shards are held in memory only (no node cache)."""
        return self.cache is None

    def ranged(self, shard: int) -> bool:
        """Whether ``shard`` is read by block ranges, else fetched whole
        (:func:`~.policy.reads_ranged`; decided once per shard)."""
        known = self._ranged.get(shard)
        if known is None:
            source, local = self.catalog.locate(shard)
            opts = self.options
            known = self._ranged[shard] = reads_ranged(
                ShardFacts.of(source.shards[local]),
                ranged_reads=opts.ranged_reads,
                cached=self.cache is not None,
                local_store=source.store().capabilities.local,
                unverified_blocks=opts.unverified_blocks,
                source=source.source.uri,
            )
        return known

    def mode(self, shard: int) -> ReadMode:
        """How ``shard`` is read in the current pass (:func:`~.policy.mode_of`)."""
        return mode_of(
            shard, ranged=self.ranged(shard), light=self.light, cached=not self.cacheless
        )

    def start_pass(self, light: LightShards) -> None:
        """A pass starts with ``light`` as its light shards: in cache mode, the blocks held
        in memory of the last pass's unfilled shards that this pass fills are freed."""
        if self._memory is not None and not self.cacheless:
            for shard in self.light.unfilled - light.unfilled:
                self._memory.drop(shard)
        self.light = light

    def queue(self) -> RangeQueue:
        """The process's range queue (made on first use)."""
        with self._lock:  # prefetch threads and the reader race to build it
            if self._queue is None:
                threads = max(
                    self.options.download_threads, source_connections(self.catalog.sources)
                )
                capacity = self.catalog.sources[0].store().capabilities.connection_limit
                self._queue = RangeQueue(threads, capacity)
            return self._queue

    def memory_shards(self) -> MemoryShards:
        """The memory-held shards (made on first use)."""
        queue = self.queue()
        with self._lock:
            if self._memory is None:
                self._memory = MemoryShards(
                    queue=queue,
                    budget_bytes=self.options.memory_budget_bytes,
                    range_bytes=self.options.range_bytes,
                    stats=self.stats,
                    peers=self.peers,  # the node's processes read each other's blocks
                )
            return self._memory

    def close(self) -> None:
        """Free the memory-held shards and stop the queue's threads."""
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        if self._queue is not None:
            self._queue.close()
            self._queue = None
        self.fill_states.close()


def source_connections(sources: Sequence[ResolvedSource]) -> int:
    """Threads for ranged reads: the most concurrent requests the sources' stores allow."""
    best = 8
    for source in sources:
        best = max(best, source.store().capabilities.max_connections)
    return best
