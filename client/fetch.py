"""Per-process shard access: prefetch through the node cache, lease, memory-map.

A :class:`ShardFetcher` lives in one process (the main process or one DataLoader
worker). It downloads shards through :class:`~shardstream.client.cache.ShardCache` (one
download per shard per node, whoever asks first) on a small thread pool, so downloads
run ahead of consumption in the plan's order while the worker builds batches, and the
number of connections is bounded (``download_threads`` per worker). Shards being read
are *leased*, which pins them against eviction, and memory-mapped with
:class:`~shardstream.mds.ShardReader`; the least recently used leases are released once
more than ``open_shards`` are held.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.client.cache import ShardCache
from shardstream.client.options import CacheOptions
from shardstream.client.source import ResolvedSource
from shardstream.mds import ShardReader, decompress_shard

__all__ = ["ShardFetcher", "fetch_shard"]

log = logging.getLogger(__name__)


def fetch_shard(source: ResolvedSource, shard: int, dest: Path) -> None:
    """Download shard ``shard`` of ``source`` to ``dest`` verified and uncompressed."""
    info = source.shards[shard]
    key = source.keys[shard]
    stored = info.stored
    store = source.store()
    if info.compression is None:
        store.download(key, dest, expected_size=stored.bytes, expected_hashes=stored.hashes)
        return
    packed = dest.with_name(dest.name + ".packed")
    try:
        store.download(key, packed, expected_size=stored.bytes, expected_hashes=stored.hashes)
        decompress_shard(packed, dest, info.compression, expected_size=info.raw_data.bytes)
    finally:
        packed.unlink(missing_ok=True)


class ShardFetcher:
    """Leases, opens and prefetches the shards of one or more sources in one process.

    Shards are addressed by their *global* index: the sources' shard lists concatenated
    in source order, as the epoch plan numbers them.
    """

    def __init__(self, sources: Sequence[ResolvedSource], options: CacheOptions) -> None:
        self._sources = list(sources)
        counts = [len(s.shards) for s in self._sources]
        self._offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._options = options
        self._cache = ShardCache(options.root, limit_bytes=options.limit_bytes)
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

    def prefetch(self, shards: Sequence[int] | np.ndarray[Any, Any]) -> None:
        """Start downloading ``shards`` (in this order) that are neither open nor in flight."""
        for shard in (int(s) for s in shards):
            if shard in self._open or shard in self._pending:
                continue
            key, _, _, _ = self._fetch_args(shard)
            if self._cache.contains(key):
                continue  # warm: no thread, no lock; the lease pins it when needed
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._options.download_threads, thread_name_prefix="shardstream-fetch"
                )
            self._pending[shard] = self._pool.submit(self._prefetch_one, shard)

    def _prefetch_one(self, shard: int) -> None:
        key, size, source, local = self._fetch_args(shard)
        self._cache.prefetch(key, lambda p: fetch_shard(source, local, p), size=size)

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
        pending = self._pending.pop(shard, None)
        if pending is not None:
            try:
                pending.result()
            except Exception as exc:  # the lease below retries and raises the real error
                log.debug("prefetch of shard %d failed: %s", shard, exc)
        key, size, source, local = self._fetch_args(shard)
        stack = contextlib.ExitStack()
        try:
            path = stack.enter_context(
                self._cache.lease(key, lambda p: fetch_shard(source, local, p), size=size)
            )
            reader = ShardReader(Path(path), source.shards[local])
        except BaseException:
            stack.close()
            raise
        self._open[shard] = (reader, stack)
        return reader

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

    def close(self) -> None:
        """Release every lease and stop the download threads."""
        for _, stack in self._open.values():
            stack.close()
        self._open.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()
