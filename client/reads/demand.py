"""Block demand: the bytes the next batches need, fetched first and waited for.

The batch stream tells the fetcher which samples the next batches need (:meth:`want`,
returns at once) and which the batch being built needs now (:meth:`need`, waits); their
blocks are fetched first (:mod:`~shardstream.client.reads.partial`) and a batch is built as
soon as its own blocks are present and verified. A shard is read from where this process
has it now: a complete reader, this process's own fill of the cache's download file, or a
memory-backed partial (cacheless mode, or early reads of a shard another process is
downloading). In cacheless mode the chunk's batch numbers stamp the blocks they use, so the
memory budget never evicts blocks a batch still to be built wants.

:class:`BlockDemand` is a part of :class:`~shardstream.client.reads.fetch.ShardFetcher` (a mixin
over the fetcher's state), kept apart because it is the one place that decides which bytes
are read when.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shardstream.client.reads.memory_need import check_memory_need
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.queue import DEMAND
from shardstream.mds import ShardReader

if TYPE_CHECKING:
    from shardstream.client.cache.shard_cache import ShardCache
    from shardstream.client.options import CacheOptions
    from shardstream.client.reads.memory import MemoryShards
    from shardstream.client.sources.source import ResolvedSource

__all__ = ["BlockDemand"]

log = logging.getLogger(__name__)

_FILL_START_WAIT_S = 0.2
"""How long a reader waits for this process's own fill of a shard to start before reading
the blocks it needs into memory instead."""


class BlockDemand:
    """Look-ahead and demand reads of one process's shard fetcher."""

    if TYPE_CHECKING:  # the fetcher's state and helpers this part uses
        _options: CacheOptions
        _cache: ShardCache | None
        _memory: MemoryShards | None
        _lock: threading.Lock
        _filling: dict[int, PartialShard]
        _complete: dict[int, ShardReader]
        _started: dict[int, threading.Event]
        _open: OrderedDict[int, tuple[ShardReader, contextlib.ExitStack]]
        _piece_batches_left: int
        _piece_chunks: set[int]
        _piece_shards: set[int]
        _after_pieces: list[tuple[int, PartialShard, np.ndarray[Any, Any]]]
        ranged: Callable[[int], bool]
        _fetch_args: Callable[[int], tuple[str, int, ResolvedSource, int]]
        _partial: Callable[[int], PartialShard]
        _load_whole: Callable[[int, PartialShard], None]
        _memory_get: Callable[[], MemoryShards]

    def _reading(self, shard: int) -> PartialShard | ShardReader | None:
        """Where this process reads ``shard`` from right now: a complete reader, a partial
        (this process's fill or a memory one), or ``None`` for the whole-shard lease."""
        if shard in self._open:
            return None
        with self._lock:
            done = self._complete.get(shard)
            filling = self._filling.get(shard)
        if done is not None:
            return done
        if filling is not None:
            return filling
        started = self._started.get(shard)
        if self._cache is not None and started is not None and not started.is_set():
            # This process's fill is about to start: a short wait avoids reading the same
            # blocks twice; a fill held up by another process's download is not waited for.
            started.wait(_FILL_START_WAIT_S)
            with self._lock:
                filling = self._filling.get(shard)
            if filling is not None:
                return filling
        if self._cache is not None:
            key = self._fetch_args(shard)[0]
            if not self.ranged(shard) or self._cache.contains(key):
                return None
            partial = self._partial(shard)
            # Another process may be downloading it: its download files serve blocks too.
            partial.see_downloads(functools.partial(self._cache.layout.shard_files, key))
            return partial
        return self._partial(shard)

    def want(
        self,
        shards: np.ndarray[Any, Any],
        local: np.ndarray[Any, Any],
        batches: Sequence[int] | None = None,
    ) -> None:
        """Start fetching the blocks of samples ``local[i]`` of ``shards[i]`` (the next
        batches, numbered ``batches``: their blocks stay in memory until then); returns at
        once."""
        tick = self._use_time(batches, ahead=True)
        self._request_after_pieces()
        by_piece = self._by_piece(batches, first_call=True)
        groups = _by_shard(shards, local)
        places = [
            self._reading(shard) if self._cache is None else self._filling.get(shard)
            for shard, _ in groups
        ]
        pieces: set[int] = set()  # shards whose samples this chunk reads by piece
        for (shard, idx), place in zip(groups, places, strict=True):
            if isinstance(place, PartialShard) and self.ranged(shard):
                place.header.request()  # every header in flight at once, not one after another
                if (by_piece or shard in self._piece_shards) and place.request_pieces(idx):
                    pieces.add(shard)  # its blocks are requested once the chunk is out
        for (shard, idx), where in zip(groups, places, strict=True):
            if shard in pieces:
                continue
            if isinstance(where, PartialShard) and where.complete() is False:
                if self._cache is None and not self.ranged(shard):
                    continue  # whole-shard fallback: loaded by prefetch
                try:
                    blocks = where.header.blocks_for(idx)
                except Exception as exc:  # raised again, with context, by need()
                    log.debug("look-ahead for shard %d: %s", shard, exc)
                    continue
                if self._memory is not None and self._cache is None:
                    self._memory.touch(where, blocks, tick)
                    self._memory.make_room(where.missing_bytes(blocks))
                where.request(blocks, DEMAND, bulk=True)

    def need(
        self,
        shards: np.ndarray[Any, Any],
        local: np.ndarray[Any, Any],
        batches: Sequence[int] | None = None,
    ) -> dict[int, ShardReader]:
        """Wait until the samples ``local[i]`` of ``shards[i]`` (of batches ``batches``)
        are present and verified; returns the readers to build this chunk from (shards
        read whole are absent: use :meth:`reader`)."""
        readers: dict[int, ShardReader] = {}
        tick = self._use_time(batches, ahead=False)
        self._request_after_pieces()
        by_piece = self._by_piece(batches, first_call=False)
        groups = _by_shard(shards, local)
        places = [self._reading(shard) for shard, _ in groups]
        pieces: set[int] = set()  # shards whose samples this chunk reads by piece
        for (shard, idx), place in zip(groups, places, strict=True):
            if isinstance(place, PartialShard) and self.ranged(shard):
                place.header.request()  # every header in flight at once, not one after another
                if (by_piece or shard in self._piece_shards) and place.request_pieces(idx):
                    pieces.add(shard)
        waiting: list[tuple[int, PartialShard, np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
        for (shard, idx), where in zip(groups, places, strict=True):
            if isinstance(where, ShardReader):
                readers[shard] = where
            elif isinstance(where, PartialShard):
                if self._cache is None and not self.ranged(shard):
                    self._load_whole(shard, where)
                    readers[shard] = where.reader()
                    continue
                blocks = where.header.blocks_for(idx)
                if self._memory is not None and self._cache is None:
                    self._memory.touch(where, blocks, tick)  # never evicted under this chunk
                if shard not in pieces:  # pieces go alone: blocks would share the link
                    self._request(where, blocks, bulk=True)  # all in flight before any wait
                waiting.append((shard, where, blocks, idx))
        for shard, where, blocks, idx in waiting:
            if shard in pieces:
                where.wait_samples(idx)
                readers[shard] = where.reader()
                continue  # the header's own offsets chose the pieces
            where.wait(blocks)
            readers[shard] = where.reader()
            if where.header.index_offsets_differ():
                # Blocks chosen from the index's offsets before the header came: the
                # header's own offsets decide what this chunk really needs.
                extra = np.setdiff1d(where.header.blocks_for(idx), blocks)
                if extra.size:
                    where.request(extra)
                    where.wait(extra)
        if by_piece:  # a first batch's blocks hold samples of the next ones: fetched once
            self._after_pieces = [  # it is out (the next want), not while it is being built
                (shard, where, blocks)
                for shard, where, blocks, _ in waiting
                if shard in pieces and shard not in self._piece_shards
            ]
        return readers

    def _request_after_pieces(self) -> None:
        """Request the blocks of the samples the last chunk read by piece."""
        pending, self._after_pieces = self._after_pieces, []
        for shard, where, blocks in pending:
            with self._lock:
                fill = self._filling.get(shard)
            started = self._started.get(shard)
            if fill is not None:  # the cache fill: its long ranges bring them
                self._request(fill, blocks, bulk=True)
            elif self._cache is not None and started is not None and not started.is_set():
                self._after_pieces.append((shard, where, blocks))  # its fill is starting
            else:
                self._request(where, blocks, bulk=True)

    def _request(
        self, where: PartialShard, blocks: np.ndarray[Any, Any], *, bulk: bool = False
    ) -> None:
        """Request ``blocks`` of ``where`` for a batch (cacheless: after making room);
        ``bulk``: a look-ahead read, lengthened where the process fills the shard whole."""
        if self._memory is not None and self._cache is None:
            self._memory.make_room(where.missing_bytes(blocks))
        where.request(blocks, bulk=bulk)

    def _by_piece(self, batches: Sequence[int] | None, *, first_call: bool) -> bool:
        """Whether the chunk of ``batches`` is among the process's first
        ``piece_read_batches`` batches, which read their samples by piece. ``want`` sees a
        chunk first and counts it; ``need`` then finds it marked."""
        if not batches:
            return False
        chunk = int(min(batches))
        if chunk in self._piece_chunks:
            if not first_call:
                self._piece_chunks.discard(chunk)
            return True
        if self._piece_batches_left < len(batches):
            self._piece_batches_left = 0  # later chunks are larger still
            return False
        self._piece_batches_left -= len(batches)
        if first_call:
            self._piece_chunks.add(chunk)
        return True

    def plan_memory(self, need: int, last: dict[int, int]) -> None:
        """Cacheless: refuse a budget below the window's ``need`` (bytes) before any read,
        and learn the last batch of each shard (its blocks go first once it is past)."""
        if self._cache is not None:
            return
        check_memory_need(self._options.memory_budget_bytes, need)
        self._memory_get().schedule(last)

    def _use_time(self, batches: Sequence[int] | None, *, ahead: bool) -> int:
        """The time stamped on a chunk's blocks: its last batch number when the stream
        numbers chunks (building one moves the clock to its first batch), else the next
        tick of a private clock."""
        memory = self._memory
        if memory is None:
            return 0
        if batches is None or len(batches) == 0:
            return memory.tick() + 1 if ahead else memory.tick()
        if not ahead:
            memory.now(int(min(batches)))
        return int(max(batches))


def _by_shard(
    shards: np.ndarray[Any, Any], local: np.ndarray[Any, Any]
) -> list[tuple[int, np.ndarray[Any, Any]]]:
    """``(shard, its sample indices)`` groups of a chunk, in first-use order."""
    flat_s = np.asarray(shards).reshape(-1)
    flat_l = np.asarray(local).reshape(-1)
    uniq, first = np.unique(flat_s, return_index=True)
    order = np.argsort(first)
    return [(int(uniq[i]), flat_l[flat_s == uniq[i]]) for i in order.tolist()]
