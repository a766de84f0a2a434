"""What the parts of one process's read path share: the shards, the settings, the fills.

:class:`~shardstream.client.reads.reads.ShardReads` is composed of parts (demand, fills,
leases) over one :class:`SharedReads`: the catalog of shards (:class:`ShardCatalog`), the
options, the node cache, the counters, the node's memory peers, the range queue and the
memory-held shards (both made on first use), each shard's read mode, and the state of this
process's cache fills, which the fills write and the demand and the leases read.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.options import ReadOptions
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.memory import MemoryShards
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.peers import MemoryPeers
from shardstream.client.reads.policy import (
    LightShards,
    ReadMode,
    ShardFacts,
    mode_of,
    reads_ranged,
)
from shardstream.client.reads.queue import RangeQueue
from shardstream.client.sources.source import ResolvedSource
from shardstream.mds import ShardInfo, ShardReader

__all__ = ["ShardCatalog", "SharedReads", "source_connections"]


class ShardCatalog:
    """The shards of one or more sources by *global* index: the sources' shard lists
    concatenated in source order, as the epoch plan numbers them. Never changes."""

    def __init__(self, sources: Sequence[ResolvedSource]) -> None:
        self.sources = list(sources)
        counts = [len(s.shards) for s in self.sources]
        self._offsets: npt.NDArray[np.int64] = np.concatenate([[0], np.cumsum(counts)]).astype(
            np.int64
        )

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, shard: int) -> tuple[ResolvedSource, int]:
        """(source, shard index within it) of a global shard index."""
        src = int(np.searchsorted(self._offsets, shard, side="right")) - 1
        return self.sources[src], shard - int(self._offsets[src])

    def info(self, shard: int) -> ShardInfo:
        """The index entry of ``shard``."""
        source, local = self.locate(shard)
        return source.shards[local]

    def cache_key(self, shard: int) -> str:
        """The node cache's key of ``shard``."""
        source, local = self.locate(shard)
        return source.cache_key(local)


@dataclass
class SharedReads:
    """The state the parts of one process's read path share (see the module docstring).

    Invariant: this process fills a shard into the cache's download file at most once at
    a time; while it does, the shard is in :attr:`filling`, then (verified and complete) in
    :attr:`complete` until a lease of the published file takes over; ``started[shard]``
    is set once that fill runs (or gave up). :attr:`lock` guards :attr:`filling`,
    :attr:`complete` and the first creation of the queue and the memory; the parts take
    no lock of each other. The catalog, options, cache, counters and peers never change.
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
    lock: threading.Lock = field(default_factory=threading.Lock)
    filling: dict[int, PartialShard] = field(default_factory=dict)
    """This process's running fills of the cache's download file, by shard."""
    complete: dict[int, ShardReader] = field(default_factory=dict)
    """Fills that completed, until their published file is leased."""
    started: dict[int, threading.Event] = field(default_factory=dict)
    """Set once this process's fill of the shard runs (or gave up): readers wait a moment
    for it rather than read the same blocks twice."""
    light: LightShards = field(default_factory=LightShards)
    """The current pass's shards read by piece or sparsely (:func:`~.policy.light_shards`)."""
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

    def queue(self) -> RangeQueue:
        """The process's range queue (made on first use)."""
        with self.lock:  # prefetch threads and the reader race to build it
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
        with self.lock:
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
        self.complete.clear()


def source_connections(sources: Sequence[ResolvedSource]) -> int:
    """Threads for ranged reads: the most concurrent requests the sources' stores allow."""
    best = 8
    for source in sources:
        best = max(best, source.store().capabilities.max_connections)
    return best
