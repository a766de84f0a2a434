"""Piece reads: a cold process's first batches read 64 KiB pieces, not 4 MiB blocks.

A batch of 32 random samples touches ~32 blocks of its shards; reading them whole before
the first batch moves 128 MB. Shards written with a piece table
(:mod:`shardstream.mds._pieces`) carry the digest of every 64 KiB of samples in their header,
which a ranged reader fetches and verifies first anyway. For its first
``CacheOptions.piece_read_batches`` batches a process therefore reads only the pieces that
hold their samples (coalesced, ahead of every block read), checks each against the table,
writes it in place in the shard's file and builds the batch from there. The blocks are still
requested behind them, and serve every later batch.

:class:`PieceReads` is a part of :class:`~shardstream.client.reads.partial.PartialShard` (a
mixin over its state): the file, the block states, the range queue and the condition that
wakes waiters. A piece is readable once it is present itself or once the blocks it lies in
are; evicting a block forgets the pieces in it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.io import BlockStats, pwrite_all, read_pieces
from shardstream.client.reads.queue import URGENT, RangeQueue
from shardstream.client.reads.ranges import coalesce
from shardstream.errors import StorageError
from shardstream.mds import PieceSpec, PieceTable, ShardInfo, ShardReader
from shardstream.storage import ObjectStore

__all__ = ["PieceReads"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]

_MISSING, _IN_FLIGHT, _PRESENT = 0, 1, 2  # as blockfetch's MISSING, IN_FLIGHT, PRESENT


class PieceReads:
    """Reading one shard's samples by piece (see the module docstring)."""

    if TYPE_CHECKING:  # the partial shard's state and helpers this part uses
        info: ShardInfo
        key: str
        store: ObjectStore
        fd: int
        size: int
        block_size: int
        state: npt.NDArray[np.int8]
        _queue: RangeQueue
        _range_blocks: int
        _stats: BlockStats
        _cond: threading.Condition
        _error: BaseException | None
        _busy: int
        _reader: ShardReader | None

        def reader(self) -> ShardReader: ...
        def request(self, blocks: I64, priority: int = ...) -> None: ...
        def _wait_until(self, ready: Callable[[], bool]) -> None: ...
        def index_offsets(self) -> I64 | None: ...
        def _done_one(self) -> None: ...

    _piece_spec: PieceSpec | None = None
    _piece_table: PieceTable | None = None
    piece_state: npt.NDArray[np.int8] = np.zeros(0, np.int8)

    def _init_pieces(self, spec: PieceSpec | None) -> None:
        """Called by the partial's constructor with the index's piece table place (``None``:
        the shard has none, or its blocks are not verified). Pieces larger than blocks (an
        index no writer of ours makes) are not used: a piece must lie in at most two blocks
        for :meth:`_blocks_hold` to be exact."""
        if spec is not None and spec.piece_size > self.block_size:
            spec = None
        self._piece_spec = spec
        self.piece_state = np.zeros(spec.pieces if spec else 0, dtype=np.int8)

    def _learn_pieces(self, header: bytes | bytearray) -> None:
        """Parse the piece table from the shard's verified ``header`` bytes."""
        if self._piece_spec is not None:
            self._piece_table = PieceTable(
                self._piece_spec, header, self.size, self.info.raw_data.basename
            )

    def request_pieces(self, local: npt.ArrayLike) -> bool:
        """Start reading, ahead of any block read, the pieces of samples ``local`` that
        neither they nor their blocks hold yet; ``False`` if the shard has no pieces."""
        if self._piece_spec is None:
            return False
        offsets = self._reader.offsets if self._reader is not None else self.index_offsets()
        if offsets is None:  # variable-size samples: their offsets come with the header
            self._queue.submit(URGENT, functools.partial(self._pieces_after_header, local))
        else:
            self._submit_pieces(self._pieces_of(offsets, local))
        return True

    def wait_samples(self, local: npt.ArrayLike) -> None:
        """Return once every byte of samples ``local`` is present, by piece or by block
        (the caller requested the blocks); raises the shard's error if it fails."""
        pieces = self._pieces_of(self.reader().offsets, local)  # the header decides
        self._submit_pieces(pieces)
        self._wait_until(
            lambda: bool(((self.piece_state[pieces] == _PRESENT) | self._blocks_hold(pieces)).all())
        )

    def forget_pieces(self, start: int, end: int) -> None:
        """Pieces overlapping file bytes ``[start, end)`` are gone (``_cond`` held)."""
        spec = self._piece_spec
        if spec is None or end <= spec.data_start:
            return
        first = max(start - spec.data_start, 0) // spec.piece_size
        last = (end - 1 - spec.data_start) // spec.piece_size
        self.piece_state[first : last + 1] = _MISSING

    def _pieces_of(self, offsets: I64, local: npt.ArrayLike) -> I64:
        assert self._piece_spec is not None
        idx = np.asarray(local, dtype=np.int64).reshape(-1)
        return self._piece_spec.of_spans(offsets[idx], offsets[idx + 1])

    def _block_span(self, pieces: I64) -> tuple[I64, I64]:
        """The first and last block each of ``pieces`` lies in (a piece is never larger
        than a block, so these are all of them)."""
        assert self._piece_spec is not None
        size, base = self._piece_spec.piece_size, self._piece_spec.data_start
        lo = (base + pieces * size) // self.block_size
        hi = (np.minimum(base + (pieces + 1) * size, self.size) - 1) // self.block_size
        return lo, hi

    def _blocks_hold(self, pieces: I64) -> npt.NDArray[np.bool_]:
        """Whether the blocks that ``pieces`` lie in are all present (``_cond`` held)."""
        lo, hi = self._block_span(pieces)
        held: npt.NDArray[np.bool_] = (self.state[lo] == _PRESENT) & (self.state[hi] == _PRESENT)
        return held

    def _pieces_after_header(self, local: npt.ArrayLike) -> None:
        try:
            offsets = self.reader().offsets
        except Exception as exc:  # the batch's own wait reports it
            log.debug("%s: no header for piece reads: %s", self.key, exc)
            return
        self._submit_pieces(self._pieces_of(offsets, local))

    def _submit_pieces(self, pieces: I64) -> None:
        assert self._piece_spec is not None
        longest = max(1, self._range_blocks * self.block_size // self._piece_spec.piece_size)
        with self._cond:
            if self._error is not None:
                return
            todo = pieces[(self.piece_state[pieces] == _MISSING) & ~self._blocks_hold(pieces)]
            self.piece_state[todo] = _IN_FLIGHT
            runs = coalesce(todo, longest)
            self._busy += len(runs)
        for first, last in runs:
            self._queue.submit(URGENT, functools.partial(self._fetch_pieces, first, last))

    def _fetch_pieces(self, first: int, last: int) -> None:
        done = False
        try:
            self.reader()  # the header, with the piece table
            table = self._piece_table
            assert table is not None
            offset, data = read_pieces(
                self.store, self.key, self.info, table, (first, last), stats=self._stats
            )
            with self._cond:  # the file may be closed meanwhile: never write a reused fd
                if self.fd < 0:
                    raise StorageError(f"{self.key}: the partial shard was closed")
                pwrite_all(self.fd, data, offset)
                self.piece_state[first : last + 1] = _PRESENT
            done = True
        except Exception as exc:  # the batch waits for the blocks instead
            log.debug("%s: pieces %d-%d: %s; reading their blocks", self.key, first, last, exc)
        finally:
            with self._cond:
                if not done:
                    self.piece_state[first : last + 1] = _MISSING
                self._done_one()
                self._cond.notify_all()
        if not done:
            self.request(self._blocks_of(first, last))

    def _blocks_of(self, first: int, last: int) -> I64:
        """The blocks that pieces ``first..last`` lie in."""
        lo, hi = self._block_span(np.array([first, last], dtype=np.int64))
        return np.arange(int(lo[0]), int(hi[1]) + 1, dtype=np.int64)
