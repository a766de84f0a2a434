"""Leases: whole shards and background fills through the node cache, leased and opened.

:class:`ShardLeases` is the part of :class:`~shardstream.client.reads.reads.ShardReads`
that downloads shards through :class:`~shardstream.client.cache.shard_cache.ShardCache`
(one download per shard per node, whoever asks first) on a small thread pool, so
downloads run ahead of consumption in the plan's order while the process builds batches,
and the number of connections is bounded (``download_threads`` per process). Shards being
read are *leased*, which pins them against eviction, and memory-mapped with
:class:`~shardstream.mds.ShardReader`; the least recently used leases are released once
more than ``open_shards`` are held. Ranged shards are leased with a fill as their fetch
function (:mod:`~shardstream.client.reads.fills`); in cacheless mode, a shard's "lease" is
its memory-held partial.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.client.reads.fill_states import FillAttempt
from shardstream.client.reads.fills import ShardFills
from shardstream.client.reads.read_state import SharedReads
from shardstream.errors import ConfigError
from shardstream.mds import ShardReader

__all__ = ["ShardLeases"]

log = logging.getLogger(__name__)


class ShardLeases:
    """The leased shards of one process, and the downloads that run ahead of them."""

    def __init__(self, shared: SharedReads, fills: ShardFills) -> None:
        self._shared = shared
        self._fills = fills
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future[None]] = {}
        self._open: OrderedDict[int, tuple[ShardReader, contextlib.ExitStack]] = OrderedDict()

    def holds(self, shard: int) -> bool:
        """Whether ``shard`` is leased and open (read it with :meth:`reader`)."""
        return shard in self._open

    def _pool_get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            # Ranged fills only wait on the range queue, so a whole window fills at once.
            threads = self._shared.options.download_threads
            if self._shared.options.ranged_reads:
                threads = max(threads, 16)
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="shardstream-fetch")
        return self._pool

    def prefetch(self, shards: Sequence[int] | np.ndarray[Any, Any], *, fills: bool = True) -> None:
        """Start fetching ``shards`` (in this order) that are neither open nor in flight:
        whole, or as a background fill; in cacheless mode, their headers.

        ``fills=False`` leaves out the background fills of ranged shards: a cold first
        batch reads its own blocks by range, and fills started beside it would share the
        link with them (they start with the next chunk, adopting the blocks read)."""
        shared = self._shared
        for shard in (int(s) for s in shards):
            if shard in self._open or shard in self._pending:
                continue
            if shared.fill_states.completed(shard) is not None:
                continue
            if shared.cache is None:
                self._pending[shard] = self._pool_get().submit(self._fills.open_memory, shard)
                continue
            if (not fills or shard in shared.light.unfilled) and shared.ranged(shard):
                continue
            if shared.cache.contains(shared.catalog.cache_key(shard)):
                continue  # warm: no thread, no lock; the lease pins it when needed
            attempt = shared.fill_states.schedule(shard)
            self._pending[shard] = self._pool_get().submit(self._prefetch_one, shard, attempt)

    def _prefetch_one(self, shard: int, attempt: FillAttempt) -> None:
        shared = self._shared
        assert shared.cache is not None
        source, local = shared.catalog.locate(shard)
        info = source.shards[local]
        ranged = shared.ranged(shard)
        fetch = self._fills.fill_into(shard, attempt) if ranged else self._fills.whole(shard)
        try:
            hashes = info.raw_data.hashes
            shared.cache.prefetch(
                source.cache_key(local), fetch, size=info.raw_data.bytes, hashes=hashes
            )
        finally:
            shared.fill_states.give_up(attempt)  # ended unless its fill ran

    def in_flight(self) -> int:
        """Downloads started by this process and not yet finished."""
        for shard in [s for s, fut in self._pending.items() if fut.done()]:
            self._pending.pop(shard)
        return len(self._pending)

    def reader(self, shard: int) -> ShardReader:
        """The open reader of ``shard``, leasing (and if needed downloading) it first."""
        shared = self._shared
        entry = self._open.get(shard)
        if entry is not None:
            self._open.move_to_end(shard)
            return entry[0]
        if shared.cache is None:
            partial = self._fills.partial(shard)
            if not shared.ranged(shard):
                self._fills.load_whole(partial)
            return partial.reader()
        pending = self._pending.pop(shard, None)
        if pending is not None:
            try:
                pending.result()
            except Exception as exc:  # the lease below retries and raises the real error
                log.debug("prefetch of shard %d failed: %s", shard, exc)
        source, local = shared.catalog.locate(shard)
        info = source.shards[local]
        fetch = self._fills.fill_into(shard) if shared.ranged(shard) else self._fills.whole(shard)
        stack = contextlib.ExitStack()
        try:
            hashes = info.raw_data.hashes  # what the cache checks it against
            lease = shared.cache.lease(
                source.cache_key(local), fetch, size=info.raw_data.bytes, hashes=hashes
            )
            path = stack.enter_context(lease)
            reader = ShardReader(Path(path), info)
        except BaseException:
            stack.close()
            raise
        self._open[shard] = (reader, stack)
        shared.fill_states.leased(shard)
        if shared.memory is not None:
            shared.memory.drop(shard)
        return reader

    def release_unused(self, keep: set[int]) -> None:
        """Release least recently used leases beyond ``open_shards``, never one in ``keep``."""
        excess = len(self._open) - max(self._shared.open_shards, len(keep))
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
        """Release every lease and stop the download threads, after giving background
        fills up to ``finish_fills_s`` to land in the cache; fills still running fail."""
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
        for partial in self._shared.fill_states.running():
            partial.fail(ConfigError("the shard reads were closed"))
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()
