"""Piece digests: verify a cold reader's first samples without fetching whole blocks.

Block digests (``shardstream.mds._blocks``) are 4 MiB apart so that the index stays short,
and a ranged reader must fetch a whole block to check any byte of it. A first batch of 32
random samples touches about 32 blocks, so a cold reader moves 128 MB before it can hand
out 128 KB of samples. Finer digests in the index would make ``index.json`` long (a 10 TB
dataset at 64 KiB would carry gigabytes of hex). So the writer puts them in the shard:

    num_samples | offsets[num_samples + 1] | config JSON | piece table | sample 0 | ...

The *piece table* is the ``xxh3_64`` digest (8 bytes, as ``xxh3_64_digest`` returns it) of
every ``piece_size`` bytes of the sample data, counted from the first sample
(``offsets[0]``): piece ``p`` is bytes ``[offsets[0] + p * piece_size, ...)``, the last one
short. It is the last part of the header, so the header digest (``header:xxh3_64:<len>``)
covers it: a reader that fetched and verified the header holds every piece digest of the
shard, and can fetch and verify one 64 KiB piece per sample. The index records where the
table is and its own digest, in one more ``raw_data.hashes`` entry::

    "pieces:xxh3_64:65536": "<16 hex digits: the digest of the table's bytes>"

MosaicML's reader locates samples by their offsets and never parses the header past them,
so it reads such shards (``tests/mds/test_compat.py``); they are no longer byte-identical
to ``streaming.MDSWriter``'s (``piece_size=None`` writes none). Compressed shards carry
none, and neither do shards without a header digest.

Shards written by someone else (MosaicML's writer) have no table in their header, and
registering them must not rewrite them. ``shardstream register`` then keeps the table in
the index itself, as the hex of its digests (16 hex digits per piece)::

    "piecetable:xxh3_64:65536": "<16 hex digits per piece, concatenated>"

Such a table is the index's word, like the block digests. Its piece size is chosen so the
table holds at most :data:`INDEX_TABLE_PIECES` pieces (16 KiB of hex a shard).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import xxhash

from shardstream.errors import CorruptShardError, FormatError
from shardstream.mds._blocks import (
    MIN_BLOCK_SIZE,
    Buffer,
    HeaderDigest,
    blocks_of_spans,
    checked_size,
    digest_key_of,
    is_lower_hex,
)

__all__ = [
    "DEFAULT_PIECE_SIZE",
    "PIECES_PREFIX",
    "PIECE_TABLE_PREFIX",
    "PieceSpec",
    "PieceTable",
    "check_piece_size",
    "index_piece_size",
    "index_table_entry",
    "parse_piece_spec",
    "piece_table",
    "pieces_entry",
]

DEFAULT_PIECE_SIZE = 64 << 10
"""Bytes per piece (64 KiB): a 4 KB token sample is read with ~16 samples' worth of bytes,
one round trip; the table adds 8 bytes per 64 KiB (0.012 % of the shard)."""

PIECE_ALGO = "xxh3_64"
PIECES_PREFIX = "pieces:"
PIECE_TABLE_PREFIX = "piecetable:"
"""A piece table held in the index (registered shards), not in the shard's header."""
INDEX_TABLE_PIECES = 1024
"""Most pieces of a table held in the index: the piece size grows with the shard."""
_WIDTH = 8  # bytes per xxh3_64 digest

I64 = npt.NDArray[np.int64]


def check_piece_size(piece_size: int | None) -> int | None:
    """``None`` (no piece table) or a byte count in ``[4096, 2**32)``; else ConfigError."""
    return checked_size("piece_size", piece_size)


def table_length(data_bytes: int, piece_size: int) -> int:
    """Bytes of the piece table of ``data_bytes`` bytes of samples."""
    return -(-data_bytes // piece_size) * _WIDTH


def piece_table(parts: Sequence[Buffer], piece_size: int) -> bytes:
    """The piece table of the sample data ``parts`` (concatenated).

    A shard's samples often come as tens of thousands of small parts; the parts of each
    piece are joined and hashed at once (a few numpy calls per shard, one join per piece),
    not fed to a hasher one part at a time. Only the piece's own bytes are joined (the
    first and last parts trimmed to it): parts can also be a few slices of tens of MB (an
    import's units), and joining them whole for every piece copied the shard a thousand
    times over."""
    views = [memoryview(part).cast("B") for part in parts]
    if len(views) == 1:
        data = views[0]
        return b"".join(
            xxhash.xxh3_64_digest(data[at : at + piece_size])
            for at in range(0, len(data), piece_size)
        )
    lengths = np.fromiter((len(v) for v in views), dtype=np.int64, count=len(views))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    lows = np.arange(0, total, piece_size, dtype=np.int64)
    first = np.searchsorted(ends, lows, side="right")  # the part holding each piece's start
    stop = np.searchsorted(starts, np.minimum(lows + piece_size, total), side="left")
    digests = []
    for low, a, b in zip(lows.tolist(), first.tolist(), stop.tolist(), strict=True):
        skip, high = low - int(starts[a]), min(low + piece_size, total)
        if b - a == 1:  # within one part: hashed in place
            digests.append(xxhash.xxh3_64_digest(views[a][skip : skip + high - low]))
            continue
        last = views[b - 1]
        body = [views[a][skip:], *views[a + 1 : b - 1], last[: high - int(starts[b - 1])]]
        digests.append(xxhash.xxh3_64_digest(b"".join(body)))
    return b"".join(digests)


def pieces_entry(table: bytes, piece_size: int) -> tuple[str, str]:
    """``(key, value)`` of the ``raw_data.hashes`` entry that describes ``table``."""
    return f"{PIECES_PREFIX}{PIECE_ALGO}:{piece_size}", xxhash.xxh3_64_hexdigest(table)


def index_piece_size(data_bytes: int, smallest: int = DEFAULT_PIECE_SIZE) -> int:
    """The piece size of a table held in the index for ``data_bytes`` bytes of samples:
    ``smallest``, doubled until the table has at most :data:`INDEX_TABLE_PIECES` pieces."""
    size = smallest
    while -(-data_bytes // size) > INDEX_TABLE_PIECES:
        size *= 2
    return size


def index_table_entry(hex_digests: str, piece_size: int) -> tuple[str, str]:
    """``(key, value)`` of the ``raw_data.hashes`` entry of a table held in the index:
    ``hex_digests`` is the hex of every piece's ``xxh3_64`` digest, in order."""
    return f"{PIECE_TABLE_PREFIX}{PIECE_ALGO}:{piece_size}", hex_digests


class PieceSpec(NamedTuple):
    """Where a shard's piece table is (from its index entry alone) and its digest."""

    piece_size: int
    data_start: int
    """``offsets[0]``: the header's length, where the first piece starts."""
    pieces: int
    digest: str
    table: bytes | None = None
    """The table itself where the index holds it (registered shards), else ``None``: the
    table is the end of the shard's header."""

    @property
    def table_span(self) -> tuple[int, int]:
        """Bytes ``[start, end)`` of the table in the file (the end of the header)."""
        return self.data_start - self.pieces * _WIDTH, self.data_start

    def of_spans(self, starts: I64, ends: I64) -> I64:
        """Sorted unique pieces covering the byte spans ``[starts[i], ends[i])`` (file
        offsets at or past the header; empty spans cover nothing)."""
        base = self.data_start
        return blocks_of_spans(starts - base, ends - base, self.piece_size)


def parse_piece_spec(
    hashes: Mapping[str, str], size: int, where: str, head: HeaderDigest | None
) -> PieceSpec | None:
    """The piece table's place among a file's ``hashes`` (``None`` if it has none), given
    the file's header digest (``parse_header_digest`` of the same ``hashes``);
    :class:`FormatError` naming the field for a malformed entry."""
    found = digest_key_of(hashes, PIECES_PREFIX, "piece tables", "piece size", where)
    listed = digest_key_of(hashes, PIECE_TABLE_PREFIX, "piece tables", "piece size", where)
    if found is not None and listed is not None:
        raise FormatError(f"{where}: field 'hashes' has two piece tables ({found[0]}, {listed[0]})")
    if listed is not None:
        return _index_table(hashes, listed, size, where, head)
    if found is None:
        return None
    key, algo, _, piece_size = found
    if algo != PIECE_ALGO or head is None or piece_size < MIN_BLOCK_SIZE:
        raise FormatError(
            f"{where}: field 'hashes' key {key!r}: a piece table needs {PIECE_ALGO}, a piece "
            f"size of at least {MIN_BLOCK_SIZE} and a header digest"
        )
    count = -(-(size - head.length) // piece_size)
    if count * _WIDTH > head.length - 8:
        raise FormatError(
            f"{where}: field 'hashes' key {key!r}: {count} piece digests do not fit the "
            f"{head.length}-byte header"
        )
    value = hashes[key]
    if not isinstance(value, str) or len(value) != 16 or not is_lower_hex(value):
        raise FormatError(f"{where}: field 'hashes' entry {key!r} must be 16 lowercase hex digits")
    return PieceSpec(piece_size, head.length, count, value)


def _index_table(
    hashes: Mapping[str, str],
    found: tuple[str, str, int, int],
    size: int,
    where: str,
    head: HeaderDigest | None,
) -> PieceSpec:
    """The spec of a piece table held in the index (``piecetable:`` entry)."""
    key, algo, _, piece_size = found
    if algo != PIECE_ALGO or head is None or piece_size < MIN_BLOCK_SIZE:
        raise FormatError(
            f"{where}: field 'hashes' key {key!r}: a piece table needs {PIECE_ALGO}, a piece "
            f"size of at least {MIN_BLOCK_SIZE} and a header digest"
        )
    count = -(-(size - head.length) // piece_size)
    value = hashes[key]
    if not isinstance(value, str) or len(value) != 2 * _WIDTH * count or not is_lower_hex(value):
        raise FormatError(
            f"{where}: field 'hashes' entry {key!r} must be {2 * _WIDTH * count} lowercase hex "
            f"digits ({count} pieces of {piece_size} bytes)"
        )
    table = bytes.fromhex(value)
    return PieceSpec(piece_size, head.length, count, xxhash.xxh3_64_hexdigest(table), table)


class PieceTable:
    """A shard's piece digests, read from its (verified) header bytes."""

    def __init__(self, spec: PieceSpec, header: Buffer, file_size: int, name: str) -> None:
        if spec.table is not None:  # the index's own table: no part of the header
            self.spec, self.name, self.file_size = spec, name, file_size
            self._table = spec.table
            return
        lo, hi = spec.table_span
        table = bytes(memoryview(header).cast("B")[lo:hi])
        if len(table) != hi - lo or xxhash.xxh3_64_hexdigest(table) != spec.digest:
            raise CorruptShardError(
                f"shard {name}: the piece table (bytes {lo}-{hi}) does not match the digest "
                "the index records; the header is corrupt or not this shard's"
            )
        self.spec, self.name, self.file_size = spec, name, file_size
        self._table = table

    def span(self, first: int, last: int) -> tuple[int, int]:
        """File bytes ``[start, end)`` of pieces ``first..last`` (inclusive)."""
        size, base = self.spec.piece_size, self.spec.data_start
        return base + first * size, min(base + (last + 1) * size, self.file_size)

    def verify(self, first: int, data: Buffer) -> None:
        """Check ``data``, pieces ``first..`` read whole; :class:`CorruptShardError` naming
        the first piece that differs."""
        view, size = memoryview(data).cast("B"), self.spec.piece_size
        for k in range(-(-len(view) // size)):
            piece = first + k
            actual = xxhash.xxh3_64_digest(view[k * size : (k + 1) * size])
            if actual != self._table[piece * _WIDTH : (piece + 1) * _WIDTH]:
                lo, hi = self.span(piece, piece)
                raise CorruptShardError(
                    f"shard {self.name}: piece {piece} (bytes {lo}-{hi}) does not match its "
                    "digest in the shard header; the bytes are corrupt, fetch them again"
                )
