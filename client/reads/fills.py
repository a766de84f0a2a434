"""Shard fills: whole-shard downloads, ranged fills of the cache's download file, and
memory-held shards.

:func:`fetch_shard` downloads a shard whole (verified, uncompressed). For ranged shards the
cache's download function is a fill: the shard's blocks are written into the cache's
private download file block by block, demand first, verified against the per-block digests,
and the cache publishes the file once complete. Blocks this process read into memory
before its fill started are copied over (:func:`adopt`), not fetched twice. In cacheless
mode a shard is a memory-backed partial (headers read ahead, zstd and digest-less shards
loaded whole within the memory budget).

:class:`ShardFills` is a part of :class:`~shardstream.client.reads.fetch.ShardFetcher` (a mixin
over the fetcher's state).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from shardstream.client.cache.private_paths import open_private
from shardstream.client.reads.memory import block_size_of, check_budget
from shardstream.client.reads.partial import BlockStats, NodeSharing, PartialShard
from shardstream.client.reads.queue import FILL
from shardstream.client.reads.refetch import refetched
from shardstream.client.sources.source import ResolvedSource
from shardstream.hashing import choose_verify_algo
from shardstream.mds import ShardReader, decompress_shard

if TYPE_CHECKING:
    from shardstream.client.options import CacheOptions
    from shardstream.client.reads.memory import MemoryShards
    from shardstream.client.reads.peers import MemoryPeers
    from shardstream.client.reads.queue import RangeQueue

__all__ = ["ShardFills", "fetch_shard", "source_connections"]


def fetch_shard(source: ResolvedSource, shard: int, dest: Path) -> bool:
    """Download shard ``shard`` of ``source`` to ``dest`` verified and uncompressed.

    Returns whether the download checked the bytes of ``dest`` against a published hash
    (an uncompressed shard with one): the cache need not hash them again. Bytes that fail
    the hash are fetched again (:func:`~shardstream.client.reads.refetch.refetched`)."""
    info = source.shards[shard]
    key = source.keys[shard]
    stored = info.stored

    def download(to: Path) -> None:
        store = source.store()
        store.download(key, to, expected_size=stored.bytes, expected_hashes=stored.hashes)

    if info.compression is None:
        refetched(key, lambda: download(dest))
        return choose_verify_algo(stored.hashes) is not None
    packed = dest.with_name(dest.name + ".packed")
    try:
        refetched(key, lambda: download(packed))
        decompress_shard(packed, dest, info.compression, expected_size=info.raw_data.bytes)
    finally:
        packed.unlink(missing_ok=True)
    return False  # the packed bytes were checked; the cache hashes the shard itself


class ShardFills:
    """Whole downloads, cache fills and memory-held shards of one process's fetcher."""

    if TYPE_CHECKING:  # the fetcher's state and helpers this part uses
        _options: CacheOptions
        _memory: MemoryShards | None
        _peers: MemoryPeers
        _lock: threading.Lock
        _filling: dict[int, PartialShard]
        _complete: dict[int, ShardReader]
        stats: BlockStats
        locate: Callable[[int], tuple[ResolvedSource, int]]
        ranged: Callable[[int], bool]
        _queue_get: Callable[[], RangeQueue]
        _memory_get: Callable[[], MemoryShards]

    @staticmethod
    def _whole(source: ResolvedSource, local: int) -> Callable[[Path], bool]:
        return lambda p: fetch_shard(source, local, p)

    def _fill_into(
        self, shard: int, started: threading.Event | None = None
    ) -> Callable[[Path], bool]:
        """The cache's fetch function for a ranged shard: fill ``target`` block by block
        (demand first), verify, and let the cache publish it (without hashing it again
        where every block was checked against its digest on arrival)."""

        def fill(target: Path) -> bool:
            source, local = self.locate(shard)
            info = source.shards[local]
            fd = open_private(target, os.O_RDWR | os.O_EXCL)
            block = block_size_of(info)
            early = self._memory.get(shard) if self._memory is not None else None
            # Blocks still on their way into memory here or in another process of the node
            # are waited for (the claims) and copied, not fetched again; other processes
            # of the node add blocks to this file (node_shared).
            node_key = source.cache_key(local)
            peers = self._peers
            own = [target] + ([early.path] if early is not None else [])
            sharing = NodeSharing(
                peers=lambda: [*own, *peers.others(node_key)],
                claims=peers.claims(node_key),
                node_shared=True,
            )
            partial = PartialShard(
                info=info,
                key=source.keys[local],
                store=source.store(),
                fd=fd,
                path=target,
                queue=self._queue_get(),
                block_size=block,
                range_blocks=max(1, self._options.range_bytes // block),
                stats=self.stats,
                sharing=sharing,
                bulk=True,  # every block is fetched: the look-ahead reads long ranges
            )
            if early is not None:
                partial.adopt(early)  # blocks read before this fill started: not twice
            with self._lock:
                self._filling[shard] = partial
            if started is not None:
                started.set()  # readers waiting for this fill use it from now on
            try:
                # The header first, as a batch's read: the batches' block reads need its
                # offsets, and the fill's first range must not hold it back behind 8 MB.
                partial.reader()
                partial.wait_all(FILL)
                partial.verify_whole()
                reader = partial.reader()
                with self._lock:
                    self._complete[shard] = reader
            except BaseException as exc:
                partial.fail(exc)
                raise
            finally:
                with self._lock:
                    self._filling.pop(shard, None)
                partial.close_file()
            if self._memory is not None:
                self._memory.drop(shard)
            peers.release(node_key)
            return partial.verified_on_arrival

        return fill

    def _open_memory(self, shard: int) -> None:
        """Cacheless: create the shard's partial and read its header (or all of it, for
        shards that must be read whole)."""
        partial = self._partial(shard)
        if self.ranged(shard):
            partial.reader()
        else:
            self._load_whole(shard, partial)

    def _load_whole(self, shard: int, partial: PartialShard) -> None:
        memory = self._memory_get()

        def load() -> None:
            check_budget(self._options.memory_budget_bytes, partial.info)
            memory.make_room(partial.info.raw_data.bytes)
            memory.load_whole(partial, partial.info.compression)

        partial.load_once(load)

    def _partial(self, shard: int) -> PartialShard:
        source, local = self.locate(shard)
        return self._memory_get().open(
            shard,
            source.shards[local],
            source.keys[local],
            source.store(),
            node_key=source.cache_key(local),
        )


def source_connections(sources: Sequence[ResolvedSource]) -> int:
    """Threads for ranged reads: the most concurrent requests the sources' stores allow."""
    best = 8
    for source in sources:
        best = max(best, source.store().capabilities.max_connections)
    return best
