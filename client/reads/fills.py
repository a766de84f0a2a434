"""Shard fills: whole-shard downloads, ranged fills of the cache's download file, and
memory-held shards.

:func:`fetch_shard` downloads a shard whole (verified, uncompressed). For ranged shards the
cache's download function is a fill: the shard's blocks are written into the cache's
private download file block by block, demand first, verified against the per-block digests,
and the cache publishes the file once complete. Blocks this process read into memory
before its fill started are copied over (:meth:`PartialShard.adopt`), not fetched twice.
In cacheless mode a shard is a memory-backed partial (headers read ahead, zstd and
digest-less shards loaded whole within the memory budget).

:class:`ShardFills` is a part of :class:`~shardstream.client.reads.reads.ShardReads`, over
its :class:`~shardstream.client.reads.read_state.SharedReads`: it runs the fills whose
state (:class:`~.fill_states.FillStates`) the leases schedule and the demand reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from shardstream.client.cache.private_paths import open_private
from shardstream.client.reads.block_sources import NodeSharing
from shardstream.client.reads.fill_states import FillAttempt
from shardstream.client.reads.memory import check_budget
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.queue import FILL
from shardstream.client.reads.ranges import block_size_of
from shardstream.client.reads.refetch import refetched
from shardstream.client.sources.source import ResolvedSource
from shardstream.hashing import choose_verify_algo
from shardstream.mds import decompress_shard

if TYPE_CHECKING:
    from shardstream.client.reads.read_state import SharedReads

__all__ = ["ShardFills", "fetch_shard"]


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
    """Whole downloads, cache fills and memory-held shards of one process's read path."""

    def __init__(self, shared: SharedReads) -> None:
        self._shared = shared

    def whole(self, shard: int) -> Callable[[Path], bool]:
        """The cache's fetch function for a shard read whole."""
        source, local = self._shared.catalog.locate(shard)
        return lambda p: fetch_shard(source, local, p)

    def fill_into(self, shard: int, scheduled: FillAttempt | None = None) -> Callable[[Path], bool]:
        """The cache's fetch function for a ranged shard: fill ``target`` block by block
        (demand first), verify, and let the cache publish it (without hashing it again
        where every block was checked against its digest on arrival). ``scheduled``: the
        attempt the leases queued it as (``None``: a lease's own fill)."""
        shared = self._shared

        def fill(target: Path) -> bool:
            source, local = shared.catalog.locate(shard)
            info = source.shards[local]
            fd = open_private(target, os.O_RDWR | os.O_EXCL)
            block = block_size_of(info)
            memory = shared.memory
            early = memory.get(shard) if memory is not None else None
            # Blocks still on their way into memory here or in another process of the node
            # are waited for (the claims) and copied, not fetched again; other processes
            # of the node add blocks to this file (node_shared).
            node_key = source.cache_key(local)
            peers = shared.peers
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
                queue=shared.queue(),
                block_size=block,
                range_blocks=max(1, shared.options.range_bytes // block),
                stats=shared.stats,
                sharing=sharing,
                bulk=True,  # every block is fetched: the look-ahead reads long ranges
            )
            if early is not None:
                partial.adopt(early)  # blocks read before this fill started: not twice
            states = shared.fill_states
            attempt = states.run(shard, partial, scheduled)  # readers use it from now on
            try:
                # The header first, as a batch's read: the batches' block reads need its
                # offsets, and the fill's first range must not hold it back behind 8 MB.
                partial.reader()
                partial.wait_all(FILL)
                partial.verify_whole()
                states.complete(attempt, partial.reader())
            except BaseException as exc:
                partial.fail(exc)
                raise
            finally:
                states.end(attempt)
                partial.close_file()
            if shared.memory is not None:
                shared.memory.drop(shard)
            peers.release(node_key)
            return partial.verified_on_arrival

        return fill

    def join(self, shard: int) -> PartialShard | None:
        """Cache mode: this process's partial over the node cache's download file of
        ``shard`` that another process is filling (:meth:`MemoryShards.join`), or ``None``
        when none is (or this process holds a memory copy of it already)."""
        shared = self._shared
        if shared.cache is None:
            return None
        memory = shared.memory_shards()
        held = memory.get(shard)
        if held is not None:
            return held if held.sharing.node_shared else None
        source, local = shared.catalog.locate(shard)
        node_key = source.cache_key(local)
        for path in shared.cache.layout.downloads(node_key, not_of=os.getpid()):
            joined = memory.join(
                shard,
                source.shards[local],
                source.keys[local],
                source.store(),
                node_key=node_key,
                download=path,
            )
            if joined is not None:
                return joined
        return None

    def open_memory(self, shard: int) -> None:
        """Cacheless: create the shard's partial and read its header (or all of it, for
        shards that must be read whole)."""
        partial = self.partial(shard)
        if self._shared.ranged(shard):
            partial.reader()
        else:
            self.load_whole(partial)

    def load_whole(self, partial: PartialShard) -> None:
        """Read a memory-held shard whole, once, within the memory budget."""
        memory = self._shared.memory_shards()
        budget = self._shared.options.memory_budget_bytes

        def load() -> None:
            check_budget(budget, partial.info)
            memory.make_room(partial.info.raw_data.bytes)
            memory.load_whole(partial, partial.info.compression)

        partial.load_once(load)

    def partial(self, shard: int) -> PartialShard:
        """This process's memory-held partial of ``shard`` (made empty on first use)."""
        source, local = self._shared.catalog.locate(shard)
        return self._shared.memory_shards().open(
            shard,
            source.shards[local],
            source.keys[local],
            source.store(),
            node_key=source.cache_key(local),
        )
