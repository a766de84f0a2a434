"""Block demand: the bytes the next batches need, fetched first and waited for.

The owner passes on which samples the next batches need (:meth:`BlockDemand.want`,
returns at once) and which the batch being built needs now (:meth:`BlockDemand.need`,
waits); their blocks are fetched first (:mod:`~shardstream.client.reads.partial`) and a
batch is built as soon as its own blocks are present and verified. A shard is read from
where this process has it now: a complete reader, this process's own fill of the cache's
download file, another process's download file of it opened in place
(:meth:`ShardFills.join`), or a memory-backed partial (cacheless mode, or early reads
before any process downloads it). In cacheless mode the chunk's batch numbers stamp the
blocks they use, so the memory budget never evicts blocks a batch still to be built wants.

:class:`BlockDemand` is a part of :class:`~shardstream.client.reads.reads.ShardReads`, over
its :class:`~shardstream.client.reads.read_state.SharedReads`, kept apart because it is the one
place that decides which bytes are read when (by the rules of :mod:`.policy`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardstream.client.reads.fills import ShardFills
from shardstream.client.reads.leases import ShardLeases
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.policy import PieceBatches, ReadMode
from shardstream.client.reads.queue import DEMAND
from shardstream.client.reads.read_state import SharedReads
from shardstream.mds import ShardReader

__all__ = ["BlockDemand"]

log = logging.getLogger(__name__)

I64 = np.ndarray[Any, Any]

_FILL_START_WAIT_S = 0.2
"""How long a reader waits for this process's own fill of a shard to start before reading
the blocks it needs into memory instead."""


class BlockDemand:
    """Look-ahead and demand reads of one process's read path."""

    def __init__(self, shared: SharedReads, fills: ShardFills, leases: ShardLeases) -> None:
        self._shared = shared
        self._fills = fills
        self._leases = leases
        self._pieces = PieceBatches(shared.options.piece_read_batches)
        self._after_pieces: list[tuple[int, PartialShard, I64]] = []

    def _reading(self, shard: int) -> PartialShard | ShardReader | None:
        """Where this process reads ``shard`` from right now: a complete reader, a partial
        (this process's fill, another process's download file joined in place, or a memory
        one), or ``None`` for the whole-shard lease."""
        shared = self._shared
        if self._leases.holds(shard):
            return None
        fill = shared.fill_states.serving(shard)
        if fill is not None:
            return fill
        if shared.cache is not None and shared.ranged(shard):
            if shared.cache.contains(shared.catalog.cache_key(shard)):
                return None
            # Another process of the node is filling it: its download file is used in
            # place (no wait for this process's own fill, no copy of its blocks).
            joined = self._fills.join(shard)
            if joined is not None:
                return joined
        started = shared.fill_states.starting(shard) if shared.cache is not None else None
        if started is not None:
            # This process's fill is about to start: a short wait avoids reading the same
            # blocks twice; a fill held up by another process's download is not waited for.
            started.wait(_FILL_START_WAIT_S)
            filling = shared.fill_states.filling(shard)
            if filling is not None:
                return filling
        if shared.cache is not None:
            key = shared.catalog.cache_key(shard)
            if not shared.ranged(shard) or shared.cache.contains(key):
                return None
            partial = self._fills.partial(shard)
            # Another process may be downloading it: its download files serve blocks too.
            partial.see_downloads(functools.partial(shared.cache.layout.shard_files, key))
            return partial
        return self._fills.partial(shard)

    def _start_headers_and_pieces(
        self,
        groups: list[tuple[int, I64]],
        places: list[PartialShard | ShardReader | None],
        by_piece: bool,
    ) -> set[int]:
        """Every header in flight at once (not one after another), and the pieces of the
        samples read by piece; returns the shards whose samples this chunk reads by piece."""
        pieces: set[int] = set()
        for (shard, idx), place in zip(groups, places, strict=True):
            if isinstance(place, PartialShard) and self._shared.ranged(shard):
                place.header.request()
                piece_shard = self._shared.mode(shard) is ReadMode.BY_PIECE
                if (by_piece or piece_shard) and place.pieces.request(idx):
                    pieces.add(shard)  # its blocks are requested once the chunk is out
        return pieces

    def want(self, shards: I64, local: I64, batches: Sequence[int] | None = None) -> None:
        """Start fetching the blocks of samples ``local[i]`` of ``shards[i]`` (the next
        batches, numbered ``batches``: their blocks stay in memory until then); returns at
        once."""
        shared = self._shared
        tick = self._use_time(batches, ahead=True)
        self._request_after_pieces()
        by_piece = self._pieces.by_piece(batches, first_showing=True)
        groups = _by_shard(shards, local)
        places = [
            self._reading(shard) if shared.cache is None else shared.fill_states.filling(shard)
            for shard, _ in groups
        ]
        pieces = self._start_headers_and_pieces(groups, places, by_piece)
        for (shard, idx), where in zip(groups, places, strict=True):
            if shard in pieces:
                continue
            if isinstance(where, PartialShard) and where.complete() is False:
                if shared.cache is None and not shared.ranged(shard):
                    continue  # whole-shard fallback: loaded by prefetch
                try:
                    blocks = where.header.blocks_for(idx)
                except Exception as exc:  # raised again, with context, by need()
                    log.debug("look-ahead for shard %d: %s", shard, exc)
                    continue
                memory = shared.memory
                if memory is not None and shared.cache is None:
                    memory.touch(where, blocks, tick)
                    memory.make_room(where.missing_bytes(blocks))
                where.request(blocks, DEMAND, bulk=True)

    def need(
        self, shards: I64, local: I64, batches: Sequence[int] | None = None
    ) -> dict[int, ShardReader]:
        """Wait until the samples ``local[i]`` of ``shards[i]`` (of batches ``batches``)
        are present and verified; returns the readers to build this chunk from (shards
        read whole are absent: lease them)."""
        shared = self._shared
        readers: dict[int, ShardReader] = {}
        tick = self._use_time(batches, ahead=False)
        self._request_after_pieces()
        by_piece = self._pieces.by_piece(batches, first_showing=False)
        groups = _by_shard(shards, local)
        places = [self._reading(shard) for shard, _ in groups]
        pieces = self._start_headers_and_pieces(groups, places, by_piece)
        waiting: list[tuple[int, PartialShard, I64, I64]] = []
        for (shard, idx), where in zip(groups, places, strict=True):
            if isinstance(where, ShardReader):
                readers[shard] = where
            elif isinstance(where, PartialShard):
                if shared.cache is None and not shared.ranged(shard):
                    self._fills.load_whole(where)
                    readers[shard] = where.reader()
                    continue
                blocks = where.header.blocks_for(idx)
                if shared.memory is not None and shared.cache is None:
                    shared.memory.touch(where, blocks, tick)  # never evicted under this chunk
                if shard not in pieces:  # pieces go alone: blocks would share the link
                    self._request(where, blocks, bulk=True)  # all in flight before any wait
                waiting.append((shard, where, blocks, idx))
        for shard, where, blocks, idx in waiting:
            if shard in pieces:
                where.pieces.wait(idx)
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
                if shard in pieces and shared.mode(shard) is not ReadMode.BY_PIECE
            ]
        return readers

    def _request_after_pieces(self) -> None:
        """Request the blocks of the samples the last chunk read by piece."""
        shared = self._shared
        pending, self._after_pieces = self._after_pieces, []
        for shard, where, blocks in pending:
            fill = shared.fill_states.filling(shard)
            if fill is not None:  # the cache fill: its long ranges bring them
                self._request(fill, blocks, bulk=True)
            elif shared.cache is not None and shared.fill_states.starting(shard) is not None:
                self._after_pieces.append((shard, where, blocks))  # its fill is starting
            else:
                self._request(where, blocks, bulk=True)

    def _request(self, where: PartialShard, blocks: I64, *, bulk: bool = False) -> None:
        """Request ``blocks`` of ``where`` for a batch (cacheless: after making room);
        ``bulk``: a look-ahead read, lengthened where the process fills the shard whole."""
        if self._shared.memory is not None and self._shared.cache is None:
            self._shared.memory.make_room(where.missing_bytes(blocks))
        where.request(blocks, bulk=bulk)

    def _use_time(self, batches: Sequence[int] | None, *, ahead: bool) -> int:
        """The time stamped on a chunk's blocks: its last batch number when the stream
        numbers chunks (building one moves the clock to its first batch), else the next
        tick of a private clock."""
        memory = self._shared.memory
        if memory is None:
            return 0
        if batches is None or len(batches) == 0:
            return memory.tick() + 1 if ahead else memory.tick()
        if not ahead:
            memory.now(int(min(batches)))
        return int(max(batches))


def _by_shard(shards: I64, local: I64) -> list[tuple[int, I64]]:
    """``(shard, its sample indices)`` groups of a chunk, in first-use order."""
    flat_s = np.asarray(shards).reshape(-1)
    flat_l = np.asarray(local).reshape(-1)
    uniq, first = np.unique(flat_s, return_index=True)
    order = np.argsort(first)
    return [(int(uniq[i]), flat_l[flat_s == uniq[i]]) for i in order.tolist()]
