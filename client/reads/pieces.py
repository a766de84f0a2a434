"""Piece reads: a cold process's first batches read 64 KiB pieces, not 4 MiB blocks.

A batch of 32 random samples touches ~32 blocks of its shards; reading them whole before
the first batch moves 128 MB. Shards written with a piece table
(:mod:`shardstream.mds._pieces`) carry the digest of every 64 KiB of samples in their header,
which a ranged reader fetches and verifies first anyway. For its first
``ReadOptions.piece_read_batches`` batches a process therefore reads only the pieces that
hold their samples (coalesced, ahead of every block read), checks each against the table,
writes it in place in the shard's file and builds the batch from there. The blocks are still
requested behind them, and serve every later batch.

:class:`PieceReader` is a component of one
:class:`~shardstream.client.reads.partial.PartialShard`: the pieces' states
(:class:`~shardstream.client.reads.blocks.BlockTable`), the table parsed from the header,
the rules that say which pieces to read and when a sample's bytes are there, and the piece
reads themselves (:meth:`PieceReader.request`, :meth:`PieceReader.wait`): on the partial's
range queue, written into its file through its public methods, the states changed under
the condition the partial hands it (the one that guards its blocks). A piece is readable
once it is present itself or once the blocks it lies in are; evicting a block forgets the
pieces in it. A piece read that fails falls back to the piece's blocks.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.blocks import BlockTable
from shardstream.client.reads.io import read_pieces
from shardstream.client.reads.queue import URGENT
from shardstream.client.reads.ranges import coalesce
from shardstream.mds import PieceSpec, PieceTable

if TYPE_CHECKING:
    from shardstream.client.reads.partial import PartialShard

__all__ = ["PieceReader"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]


class PieceReader:
    """The pieces of one partial shard's file (see the module docstring).

    ``spec`` is the index's piece table place (``None``: the shard has none, or its blocks
    are not verified). Pieces larger than blocks (an index no writer of ours makes) are not
    used: a piece must lie in at most two blocks for :meth:`held_by_blocks` to be exact.
    ``cond`` and ``blocks`` are the partial's condition and block table.
    """

    def __init__(
        self,
        partial: PartialShard,
        spec: PieceSpec | None,
        *,
        cond: threading.Condition,
        blocks: BlockTable,
        range_blocks: int,
    ) -> None:
        block_size = partial.block_size
        if spec is not None and spec.piece_size > block_size:
            spec = None
        self.spec = spec
        self.table: PieceTable | None = None
        """The digests of the pieces, once the verified header is here (:meth:`learn`)."""
        self.states = BlockTable(spec.pieces if spec else 0)
        self._partial, self._cond, self._blocks = partial, cond, blocks
        self._size, self._block_size = partial.size, block_size
        self._longest = (
            max(1, range_blocks * block_size // spec.piece_size) if spec is not None else 1
        )

    @property
    def enabled(self) -> bool:
        """Whether the shard's samples can be read by piece."""
        return self.spec is not None

    def learn(self, header: bytes | bytearray, basename: str) -> None:
        """Parse the piece table from the shard's verified ``header`` bytes."""
        if self.spec is not None:
            self.table = PieceTable(self.spec, header, self._size, basename)

    def of_samples(self, offsets: I64, local: npt.ArrayLike) -> I64:
        """The pieces that hold samples ``local`` (by the sample ``offsets``)."""
        assert self.spec is not None
        idx = np.asarray(local, dtype=np.int64).reshape(-1)
        return self.spec.of_spans(offsets[idx], offsets[idx + 1])

    def request(self, local: npt.ArrayLike) -> bool:
        """Start reading, ahead of any block read, the pieces of samples ``local`` that
        neither they nor their blocks hold yet; ``False`` if the shard has no pieces."""
        if not self.enabled:
            return False
        p = self._partial
        opened = p.header.reader_if_open()
        offsets = opened.offsets if opened is not None else p.header.index_offsets()
        if offsets is None:  # variable-size samples: their offsets come with the header
            p.submit(URGENT, functools.partial(self._after_header, local))
        else:
            self._submit(self.of_samples(offsets, local))
        return True

    def wait(self, local: npt.ArrayLike) -> None:
        """Return once every byte of samples ``local`` is present, by piece or by block
        (the caller requested the blocks); raises the shard's error if it fails."""
        pieces = self.of_samples(self._partial.reader().offsets, local)  # the header decides
        self._submit(pieces)
        self._partial.wait_until(lambda: self.ready(pieces))

    def ready(self, pieces: I64) -> bool:
        """Whether every one of ``pieces`` is readable: present, or its blocks are."""
        held = self.states.present(pieces) | self.held_by_blocks(pieces, self._blocks)
        return bool(held.all())

    def _after_header(self, local: npt.ArrayLike) -> None:
        try:
            offsets = self._partial.reader().offsets
        except Exception as exc:  # the batch's own wait reports it
            log.debug("%s: no header for piece reads: %s", self._partial.key, exc)
            return
        self._submit(self.of_samples(offsets, local))

    def _submit(self, pieces: I64) -> None:
        """Read the ones of ``pieces`` neither here nor on the way, nor held by their
        blocks (marked in flight), in coalesced runs."""
        with self._cond:
            if self._partial.failed:
                return
            todo = pieces[self.states.missing(pieces) & ~self.held_by_blocks(pieces, self._blocks)]
            self.states.request(todo)
        for first, last in coalesce(todo, self._longest):
            self._partial.submit(URGENT, functools.partial(self._fetch, first, last))

    def _fetch(self, first: int, last: int) -> None:
        p, done = self._partial, False
        try:
            p.reader()  # the header, with the piece table
            assert self.table is not None
            run = (first, last)
            offset, data = read_pieces(p.store, p.key, p.info, self.table, run, stats=p.stats)
            with self._cond:  # written and marked at once: an eviction comes before or after
                p.write([(offset, data)])  # raises once closed: never writes a reused fd
                self.states.arrive(slice(first, last + 1))
            done = True
        except Exception as exc:  # the batch waits for the blocks instead
            log.debug("%s: pieces %d-%d: %s; reading their blocks", p.key, first, last, exc)
        finally:
            with self._cond:
                if not done:
                    self.states.lose(slice(first, last + 1))
                self._cond.notify_all()
        if not done:
            p.request(self.blocks_of(first, last))

    def forget(self, start: int, end: int) -> None:
        """Pieces overlapping file bytes ``[start, end)`` are gone (partial's condition held)."""
        spec = self.spec
        if spec is None or end <= spec.data_start:
            return
        first = max(start - spec.data_start, 0) // spec.piece_size
        last = (end - 1 - spec.data_start) // spec.piece_size
        self.states.lose(slice(first, last + 1))

    def held_by_blocks(self, pieces: I64, blocks: BlockTable) -> npt.NDArray[np.bool_]:
        """Whether the blocks that ``pieces`` lie in are all present."""
        lo, hi = self._block_span(pieces)
        held: npt.NDArray[np.bool_] = blocks.present(lo) & blocks.present(hi)
        return held

    def blocks_of(self, first: int, last: int) -> I64:
        """The blocks that pieces ``first..last`` lie in."""
        lo, hi = self._block_span(np.array([first, last], dtype=np.int64))
        return np.arange(int(lo[0]), int(hi[1]) + 1, dtype=np.int64)

    def _block_span(self, pieces: I64) -> tuple[I64, I64]:
        """The first and last block each of ``pieces`` lies in (a piece is never larger
        than a block, so these are all of them)."""
        assert self.spec is not None
        size, base = self.spec.piece_size, self.spec.data_start
        lo = (base + pieces * size) // self._block_size
        hi = (np.minimum(base + (pieces + 1) * size, self._size) - 1) // self._block_size
        return lo, hi
