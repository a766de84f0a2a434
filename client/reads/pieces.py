"""Piece reads: a cold process's first batches read 64 KiB pieces, not 4 MiB blocks.

A batch of 32 random samples touches ~32 blocks of its shards; reading them whole before
the first batch moves 128 MB. Shards written with a piece table
(:mod:`shardstream.mds._pieces`) carry the digest of every 64 KiB of samples in their header,
which a ranged reader fetches and verifies first anyway. For its first
``CacheOptions.piece_read_batches`` batches a process therefore reads only the pieces that
hold their samples (coalesced, ahead of every block read), checks each against the table,
writes it in place in the shard's file and builds the batch from there. The blocks are still
requested behind them, and serve every later batch.

:class:`PieceReader` is a component of one
:class:`~shardstream.client.reads.partial.PartialShard`: the pieces' states
(:class:`~shardstream.client.reads.blocks.BlockTable`), the table parsed from the header,
and the rules that say which pieces to read and when a sample's bytes are there. The
partial calls it with its own condition held and does the file and queue I/O. A piece is
readable once it is present itself or once the blocks it lies in are; evicting a block
forgets the pieces in it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.blocks import BlockTable
from shardstream.client.reads.io import BlockStats, read_pieces
from shardstream.client.reads.ranges import coalesce
from shardstream.mds import PieceSpec, PieceTable, ShardInfo
from shardstream.storage import ObjectStore

__all__ = ["PieceReader"]

I64 = npt.NDArray[np.int64]


class PieceReader:
    """The pieces of one shard file (see the module docstring).

    ``spec`` is the index's piece table place (``None``: the shard has none, or its blocks
    are not verified). Pieces larger than blocks (an index no writer of ours makes) are not
    used: a piece must lie in at most two blocks for :meth:`held_by_blocks` to be exact.
    """

    def __init__(
        self, spec: PieceSpec | None, *, size: int, block_size: int, range_blocks: int
    ) -> None:
        if spec is not None and spec.piece_size > block_size:
            spec = None
        self.spec = spec
        self.table: PieceTable | None = None
        """The digests of the pieces, once the verified header is here (:meth:`learn`)."""
        self.states = BlockTable(spec.pieces if spec else 0)
        self._size, self._block_size = size, block_size
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

    def to_read(self, pieces: I64, blocks: BlockTable) -> list[tuple[int, int]]:
        """Runs of ``pieces`` to read: those neither here nor on the way, nor held by their
        blocks, marked in flight (partial's condition held)."""
        todo = pieces[self.states.missing(pieces) & ~self.held_by_blocks(pieces, blocks)]
        self.states.request(todo)
        return coalesce(todo, self._longest)

    def ready(self, pieces: I64, blocks: BlockTable) -> bool:
        """Whether every one of ``pieces`` is readable: present, or its blocks are."""
        return bool((self.states.present(pieces) | self.held_by_blocks(pieces, blocks)).all())

    def read(
        self,
        store: ObjectStore,
        key: str,
        info: ShardInfo,
        run: tuple[int, int],
        *,
        stats: BlockStats,
    ) -> tuple[int, bytes | bytearray]:
        """``(file offset, bytes)`` of pieces ``run`` (inclusive), checked against the table
        (which the header brought: read it first)."""
        assert self.table is not None
        return read_pieces(store, key, info, self.table, run, stats=stats)

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
