"""Per-process shard access: prefetch through the node cache, lease, memory-map.

A :class:`ShardFetcher` lives in one process (the main process or one DataLoader
worker). It downloads shards through :class:`~shardstream.client.cache.shard_cache.ShardCache` (one
download per shard per node, whoever asks first) on a small thread pool, so downloads
run ahead of consumption in the plan's order while the worker builds batches, and the
number of connections is bounded (``download_threads`` per worker). Shards being read
are *leased*, which pins them against eviction, and memory-mapped with
:class:`~shardstream.mds.ShardReader`; the least recently used leases are released once
more than ``open_shards`` are held.

Ranged reads (``CacheOptions.ranged_reads``, uncompressed shards on a remote store) are
planned by :mod:`~shardstream.client.reads.demand` (which blocks the next batches need,
fetched first) and filled by :mod:`~shardstream.client.reads.fills` (the cache's download
file written block by block, demand first, or memory-backed partials in the cacheless
``memory_only`` mode); this module decides which path a shard takes and owns the
fetcher's threads, leases and memory.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.options import CacheOptions
from shardstream.client.reads.demand import BlockDemand
from shardstream.client.reads.fills import ShardFills, fetch_shard, source_connections
from shardstream.client.reads.memory import MemoryShards, block_size_of
from shardstream.client.reads.partial import BlockStats, PartialShard
from shardstream.client.reads.peers import MemoryPeers
from shardstream.client.reads.queue import RangeQueue
from shardstream.client.sources.source import ResolvedSource
from shardstream.errors import ConfigError
from shardstream.mds import ShardReader

__all__ = ["ShardFetcher", "fetch_shard"]

log = logging.getLogger(__name__)


class ShardFetcher(ShardFills, BlockDemand):
    """Leases, opens and prefetches the shards of one or more sources in one process.

    Shards are addressed by their *global* index: the sources' shard lists concatenated
    in source order, as the epoch plan numbers them.
    """

    def __init__(
        self,
        sources: Sequence[ResolvedSource],
        options: CacheOptions,
        *,
        stats: BlockStats | None = None,
    ) -> None:
        self._sources = list(sources)
        counts = [len(s.shards) for s in self._sources]
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._options = options
        self._cache = (
            None
            if options.memory_only
            else ShardCache(options.root, limit_bytes=options.limit_bytes)
        )
        self.stats = stats if stats is not None else BlockStats()
        self._queue: RangeQueue | None = None
        self._memory: MemoryShards | None = None
        self._filling: dict[int, PartialShard] = {}
        self._piece_batches_left = options.piece_read_batches  # BlockDemand's first batches
        self._piece_chunks: set[int] = set()
        self._piece_shards: set[int] = set()  # read by piece in every batch
        self._after_pieces: list[tuple[int, PartialShard, np.ndarray[Any, Any]]] = []
        self._complete: dict[int, ShardReader] = {}
        self._lock = threading.Lock()
        self._ranged: dict[int, bool] = {}
        self._sparse: set[int] = set()  # ranged shards this rank reads little of: no fill
        self._peers = MemoryPeers()
        self._started: dict[int, threading.Event] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future[None]] = {}
        self._open: OrderedDict[int, tuple[ShardReader, contextlib.ExitStack]] = OrderedDict()

    @property
    def num_shards(self) -> int:
        """Shards over all sources."""
        return int(self._offsets[-1])

    def locate(self, shard: int) -> tuple[ResolvedSource, int]:
        """(source, shard index within it) of a global shard index."""
        src = int(np.searchsorted(self._offsets, shard, side="right")) - 1
        return self._sources[src], shard - int(self._offsets[src])

    def _fetch_args(self, shard: int) -> tuple[str, int, ResolvedSource, int]:
        source, local = self.locate(shard)
        return source.cache_key(local), source.shards[local].raw_data.bytes, source, local

    # -- which path a shard takes -------------------------------------------------------

    def ranged(self, shard: int) -> bool:
        """Whether ``shard`` is read by block ranges (else fetched whole)."""
        known = self._ranged.get(shard)
        if known is None:
            known = self._ranged[shard] = self._decide_ranged(shard)
        return known

    def _decide_ranged(self, shard: int) -> bool:
        source, local = self.locate(shard)
        info = source.shards[local]
        opts = self._options
        if info.compression is not None or not opts.ranged_reads:
            return False  # a zstd frame cannot be read in pieces
        if self._cache is not None and source.store().capabilities.local:
            return False  # a local copy is one sequential read anyway
        if getattr(info, "block_digests", None) is not None:
            # One block: by range it costs the header, pieces and then this very block
            # (~1.8x its bytes in 4-5 round trips); whole, one GET, once per node.
            return info.raw_data.bytes > block_size_of(info)
        if opts.unverified_blocks == "refuse":
            raise ConfigError(
                f"shard {info.raw_data.basename} of {source.source.uri!r} has no per-block "
                "digests, so its blocks cannot be verified; rebuild the dataset with block "
                "digests or set CacheOptions.unverified_blocks='whole_shard'"
            )
        return opts.unverified_blocks == "verify_on_completion" and self._cache is not None

    def _queue_get(self) -> RangeQueue:
        with self._lock:  # prefetch threads and the reader race to build it
            if self._queue is None:
                threads = max(self._options.download_threads, source_connections(self._sources))
                capacity = self._sources[0].store().capabilities.connection_limit
                self._queue = RangeQueue(threads, capacity)
            return self._queue

    def _memory_get(self) -> MemoryShards:
        queue = self._queue_get()
        with self._lock:
            if self._memory is None:
                self._memory = MemoryShards(
                    queue=queue,
                    budget_bytes=self._options.memory_budget_bytes,
                    range_bytes=self._options.range_bytes,
                    stats=self.stats,
                    peers=self._peers,  # the node's processes read each other's blocks
                )
            return self._memory

    def _pool_get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            # Ranged fills only wait on the range queue, so a whole window fills at once.
            threads = self._options.download_threads
            if self._options.ranged_reads:
                threads = max(threads, 16)
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardstream-fetch")
        return self._pool

    # -- whole shards and background fills ------------------------------------------------

    def prefetch(self, shards: Sequence[int] | np.ndarray[Any, Any], *, fills: bool = True) -> None:
        """Start fetching ``shards`` (in this order) that are neither open nor in flight:
        whole, or as a background fill; in cacheless mode, their headers.

        ``fills=False`` leaves out the background fills of ranged shards: a cold first
        batch reads its own blocks by range, and fills started beside it would share the
        link with them (they start with the next chunk, adopting the blocks read)."""
        for shard in (int(s) for s in shards):
            if shard in self._open or shard in self._pending or shard in self._complete:
                continue
            if self._cache is None:
                self._pending[shard] = self._pool_get().submit(self._open_memory, shard)
                continue
            if (not fills or shard in self._sparse) and self.ranged(shard):
                continue
            key, _, _, _ = self._fetch_args(shard)
            if self._cache.contains(key):
                continue  # warm: no thread, no lock; the lease pins it when needed
            started = self._started[shard] = threading.Event()
            self._pending[shard] = self._pool_get().submit(self._prefetch_one, shard, started)

    def _prefetch_one(self, shard: int, started: threading.Event) -> None:
        key, size, source, local = self._fetch_args(shard)
        assert self._cache is not None
        ranged = self.ranged(shard)
        fetch = self._fill_into(shard, started) if ranged else self._whole(source, local)
        try:
            hashes = source.shards[local].raw_data.hashes
            self._cache.prefetch(key, fetch, size=size, hashes=hashes)
        finally:
            started.set()

    # -- leases --------------------------------------------------------------------------

    def in_flight(self) -> int:
        """Downloads started by this process and not yet finished."""
        for shard in [s for s, fut in self._pending.items() if fut.done()]:
            self._pending.pop(shard)
        return len(self._pending)

    def reader(self, shard: int) -> ShardReader:
        """The open reader of ``shard``, leasing (and if needed downloading) it first."""
        entry = self._open.get(shard)
        if entry is not None:
            self._open.move_to_end(shard)
            return entry[0]
        if self._cache is None:
            partial = self._partial(shard)
            if not self.ranged(shard):
                self._load_whole(shard, partial)
            return partial.reader()
        pending = self._pending.pop(shard, None)
        if pending is not None:
            try:
                pending.result()
            except Exception as exc:  # the lease below retries and raises the real error
                log.debug("prefetch of shard %d failed: %s", shard, exc)
        key, size, source, local = self._fetch_args(shard)
        fetch = self._fill_into(shard) if self.ranged(shard) else self._whole(source, local)
        stack = contextlib.ExitStack()
        try:
            hashes = source.shards[local].raw_data.hashes  # what the cache checks it against
            path = stack.enter_context(self._cache.lease(key, fetch, size=size, hashes=hashes))
            reader = ShardReader(Path(path), source.shards[local])
        except BaseException:
            stack.close()
            raise
        self._open[shard] = (reader, stack)
        with self._lock:
            self._complete.pop(shard, None)
        if self._memory is not None:
            self._memory.drop(shard)
        return reader

    def read_sparsely(self, shards: set[int]) -> None:
        """Read ``shards`` by range only, never filling the cache with them whole: shards
        of which this rank reads a few samples (a partition boundary inside a shard),
        while another rank reads, and caches, the rest. The blocks of the previous set
        (an earlier epoch's) are freed."""
        if self._memory is not None:
            for shard in self._sparse - shards:
                self._memory.drop(shard)
        self._sparse = set(shards)

    def read_by_piece(self, shards: set[int]) -> None:
        """Read the samples of ``shards`` by piece in every batch, never by block (shards
        this rank reads a few dozen samples of: ``BatchStream._sparse_shards``)."""
        self._piece_shards = set(shards)

    def release_unused(self, keep: set[int]) -> None:
        """Release least recently used leases beyond ``open_shards``, never one in ``keep``."""
        excess = len(self._open) - max(self._options.open_shards, len(keep))
        for shard in list(self._open):
            if excess <= 0:
                break
            if shard in keep:
                continue
            _, stack = self._open.pop(shard)
            # The reader's mmap stays valid for arrays still viewing it, even if the cache
            # evicts (unlinks) the file later: the mapping holds the inode.
            stack.close()
            excess -= 1

    def close(self, *, finish_fills_s: float = 0.0) -> None:
        """Release every lease, stop the download threads, free memory-held shards.

        ``finish_fills_s`` > 0 (an epoch that ended normally) first gives background fills
        that long to land in the cache: by then the epoch has fetched nearly every block,
        so what is left is a few blocks and the whole-shard check, and a fill failed here
        would be fetched again next epoch.
        """
        if finish_fills_s > 0:
            deadline = time.monotonic() + finish_fills_s
            for future in list(self._pending.values()):
                try:
                    future.result(timeout=max(0.0, deadline - time.monotonic()))
                except Exception as exc:  # a timeout or a failed fill: the next lease retries
                    log.debug("background fill not finished at close: %s", exc)
        for _, stack in self._open.values():
            stack.close()
        self._open.clear()
        with self._lock:
            filling = list(self._filling.values())
        for partial in filling:
            partial.fail(ConfigError("the shard fetcher was closed"))
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        if self._queue is not None:
            self._queue.close()
            self._queue = None
        self._pending.clear()
        self._complete.clear()
