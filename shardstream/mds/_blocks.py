"""Per-block digests of a shard file: verify one fetched byte range without the whole shard.

A reader that fetches a few MB of a 256 MB shard by range cannot check the shard's whole-
file hash. So the writer also records the xxh3_64 digest of every ``block_size`` bytes of
the (uncompressed) shard file; a ranged reader aligns its requests to blocks
(:func:`blocks_for_range`) and checks exactly what it fetched (:func:`verify_range`).

Where they live. MosaicML's reader builds its shard objects with ``cls(**entry)`` and
``FileInfo(**raw_data)``, so any new key in a shard entry or in ``raw_data`` breaks
``streaming.StreamingDataset``; the one open map is ``raw_data.hashes`` (algorithm ->
digest, of which MosaicML reads only the algorithm a user asks it to validate). The digests
are one entry of that map::

    "raw_data": {"basename": "shard.00000.mds", "bytes": 9437184,
                 "hashes": {"sha1": "...", "xxh3_64": "...",
                            "blocks:xxh3_64:4194304": "<16 hex digits per block, concatenated>"}}

The key names the algorithm and the block size; the value holds ``ceil(bytes / block_size)``
digests, the last one over the short tail block. Keeping them in ``raw_data`` also means they
travel wherever a shard entry travels (the server's ``mds`` record, the client's node index).

Compressed shards carry none: a zstd shard is one frame, so a byte range of it cannot be
decompressed on its own and ranged reads do not apply; such shards are fetched whole and
checked against their whole-file hash.

The header has its own digest. A reader opens a shard by its header (sample count, offsets,
config: ``4 * (n + 2)`` bytes plus the config JSON, 64 KiB for 16,000 samples), then fetches
the blocks of the samples it needs. With block digests alone, the header is verified only
as part of block 0, so opening a shard would cost a whole block (4 MiB, ~45 ms on one
connection) where the header is a few KiB: a cold reader opens every shard of its window
before its first batch. So the writer also records the digest of the header's exact bytes
``[0, offsets[0])``, in one more ``raw_data.hashes`` entry whose key holds its length::

    "header:xxh3_64:65620": "<16 hex digits>"

Older indexes without it still read (the header comes with block 0).

Block size: 4 MiB by default. A ranged read of one block costs ~20-30 ms to first byte plus
~45 ms of transfer at 90 MB/s on one S3 connection, so a block is about the smallest request
that keeps a connection busy rather than waiting; smaller blocks would make every sample
read pay for more requests (S3 allows ~5,500 GET/s per prefix) and a longer index (16 hex
digits per block: 512 bytes per 128 MB shard), larger ones make the first batch wait longer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt
import xxhash

from shardstream.errors import ConfigError, CorruptShardError, FormatError
from shardstream.hashing import hash_bytes, new_hasher

if TYPE_CHECKING:
    from shardstream.mds._index import ShardInfo

DEFAULT_BLOCK_SIZE = 4 << 20
"""Bytes per digested block (4 MiB): about one round trip's worth of one S3 connection."""

BLOCK_DIGEST_ALGO = "xxh3_64"
"""The block hash: the fastest in the client's dependencies (xxhash), ~10+ GB/s per core."""

MIN_BLOCK_SIZE = 4096
"""The smallest block size the writer accepts (smaller ones only bloat the index)."""

_PREFIX = "blocks:"
_HEADER_PREFIX = "header:"
_HEX = re.compile(r"[0-9a-f]*")

Buffer = bytes | bytearray | memoryview


def digests_key(algo: str, block_size: int) -> str:
    """The ``raw_data.hashes`` key that holds the block digests, e.g. ``blocks:xxh3_64:4194304``."""
    return f"{_PREFIX}{algo}:{block_size}"


def is_digests_key(key: str) -> bool:
    """Whether a ``hashes`` key holds block, header or piece digests (not a whole-file
    hash)."""
    return key.startswith((_PREFIX, _HEADER_PREFIX, "pieces:", "piecetable:"))


def is_lower_hex(text: str) -> bool:
    """Whether ``text`` is all lowercase hex digits (how digests are written)."""
    return _HEX.fullmatch(text) is not None


def header_key(algo: str, length: int) -> str:
    """The ``raw_data.hashes`` key of the header digest, e.g. ``header:xxh3_64:65620``."""
    return f"{_HEADER_PREFIX}{algo}:{length}"


def check_block_size(block_size: int | None) -> int | None:
    """``None`` (no block digests) or a byte count in ``[4096, 2**32)``; else ConfigError."""
    return checked_size("block_size", block_size)


def checked_size(name: str, size: int | None) -> int | None:
    """``size`` if it is ``None`` or a byte count in ``[4096, 2**32)``; else ConfigError
    naming the option ``name``."""
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or not MIN_BLOCK_SIZE <= size < 1 << 32:
        raise ConfigError(
            f"{name} must be None or between {MIN_BLOCK_SIZE} and 2**32 - 1 bytes, got {size!r}"
        )
    return size


class BlockRange(NamedTuple):
    """The blocks that cover a byte range, and the block-aligned byte range to fetch.

    ``last_block`` is inclusive; ``end`` is exclusive and never past the end of the file.
    """

    first_block: int
    last_block: int
    start: int
    end: int


@dataclass(frozen=True)
class BlockDigests:
    """The block digests of one shard file, as parsed from its ``raw_data.hashes``.

    The digests stay one hex string (``hex``): a 100,000-shard index would otherwise hold
    millions of small Python strings. ``digest(i)`` slices out block ``i``'s digest.
    """

    algo: str
    block_size: int
    file_size: int
    hex: str

    @property
    def num_blocks(self) -> int:
        """``ceil(file_size / block_size)``."""
        return -(-self.file_size // self.block_size)

    @property
    def width(self) -> int:
        """Hex characters per digest."""
        return len(self.hex) // self.num_blocks if self.num_blocks else 0

    def digest(self, block: int) -> str:
        """The hex digest recorded for ``block``."""
        width = self.width
        return self.hex[block * width : (block + 1) * width]

    @property
    def digests(self) -> list[str]:
        """Every block's hex digest, in file order (builds the list: for tests and tools)."""
        return [self.digest(i) for i in range(self.num_blocks)]

    def span(self, block: int) -> tuple[int, int]:
        """Byte range ``[start, end)`` of ``block`` in the file."""
        start = block * self.block_size
        return start, min(start + self.block_size, self.file_size)

    @property
    def key(self) -> str:
        """Where they are stored in ``raw_data.hashes``."""
        return digests_key(self.algo, self.block_size)


def parse_block_digests(hashes: Mapping[str, str], size: int, where: str) -> BlockDigests | None:
    """The block digests among a file's ``hashes`` (``None`` if it has none).

    ``size`` is the file's byte count from the index and ``where`` names the file in
    errors. Raises :class:`FormatError` naming the field for a malformed key or value. The
    hex digits themselves are checked when a block is verified, not here: an index load
    stays one length check per shard.
    """
    found = digest_key_of(hashes, _PREFIX, "block digest lists", "block size", where)
    if found is None:
        return None
    key, algo, width, block_size = found
    if block_size <= 0:
        raise FormatError(f"{where}: field 'hashes' key {key!r}: block size is not a number")
    value = hashes[key]
    blocks = -(-size // block_size)
    if not isinstance(value, str) or len(value) != blocks * width:
        got = len(value) if isinstance(value, str) else type(value).__name__
        raise FormatError(
            f"{where}: field 'hashes' entry {key!r} holds {got} characters, expected "
            f"{blocks} digests of {width} hex digits for {size} bytes"
        )
    return BlockDigests(algo, block_size, size, value)


class HeaderDigest(NamedTuple):
    """The digest of a shard file's header bytes ``[0, length)``."""

    algo: str
    length: int
    hex: str

    def verify(self, data: Buffer, name: str) -> None:
        """Check ``data`` (exactly the header's bytes); :class:`CorruptShardError` if not."""
        view = memoryview(data).cast("B")
        one_shot = _ONE_SHOT.get(self.algo)
        actual = one_shot(view) if one_shot else hash_bytes(self.algo, view)
        if len(view) != self.length or actual != self.hex:
            raise CorruptShardError(
                f"shard {name}: header (bytes 0-{self.length}) has {self.algo} {actual} over "
                f"{len(view)} bytes, the index records {self.hex}; fetch it again"
            )


def parse_header_digest(hashes: Mapping[str, str], size: int, where: str) -> HeaderDigest | None:
    """The header digest among a file's ``hashes`` (``None`` if it has none); raises
    :class:`FormatError` naming the field for a malformed key or value."""
    found = digest_key_of(hashes, _HEADER_PREFIX, "header digests", "length", where)
    if found is None:
        return None
    key, algo, width, length = found
    if not 8 <= length <= size:
        raise FormatError(
            f"{where}: field 'hashes' key {key!r}: header length {length} does not fit a "
            f"{size}-byte file"
        )
    value = hashes[key]
    if not isinstance(value, str) or len(value) != width or not is_lower_hex(value):
        raise FormatError(
            f"{where}: field 'hashes' entry {key!r} must be {width} lowercase hex digits"
        )
    return HeaderDigest(algo, length, value)


class HeaderHasher:
    """The header digest of a shard file fed in any pieces: the header's length is the
    first sample offset (bytes 4-8 of the file)."""

    def __init__(self, algo: str = BLOCK_DIGEST_ALGO) -> None:
        self.algo = algo
        self._head = bytearray()
        self._length: int | None = None

    def update(self, data: Buffer) -> None:
        """Feed the next bytes of the file."""
        view = memoryview(data).cast("B")
        if self._length is None:
            need = 8 - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < 8:
                return
            self._length = int.from_bytes(self._head[4:8], "little")
        room = self._length - len(self._head)
        if room > 0:
            self._head += view[:room]

    def finish(self) -> tuple[str, str] | None:
        """``(key, digest)`` for ``raw_data.hashes``; ``None`` if the file was shorter than
        its header says (the shard's own checks report that)."""
        if self._length is None or len(self._head) != self._length:
            return None
        digest = hash_bytes(self.algo, bytes(self._head))
        return header_key(self.algo, self._length), digest


def digest_key_of(
    hashes: Mapping[str, str], prefix: str, plural: str, number: str, where: str
) -> tuple[str, str, int, int] | None:
    """The one ``<prefix><algo>:<number>`` key of ``hashes``, parsed: ``(key, algo, hex
    width, number)``; ``None`` if there is none, :class:`FormatError` if it is malformed."""
    keys = [key for key in hashes if key.startswith(prefix)]
    if not keys:
        return None
    if len(keys) > 1:
        raise FormatError(f"{where}: field 'hashes' has several {plural} {keys}")
    key = keys[0]
    algo, _, text = key[len(prefix) :].partition(":")
    try:
        width = _hex_width(algo)
    except ConfigError:
        raise FormatError(f"{where}: field 'hashes' key {key!r}: unknown algorithm") from None
    if not (text.isascii() and text.isdigit() and len(text) <= 10):
        raise FormatError(f"{where}: field 'hashes' key {key!r}: {number} is not a number")
    return key, algo, width, int(text)


@functools.cache
def _hex_width(algo: str) -> int:
    return len(new_hasher(algo).hexdigest())


class BlockHasher:
    """Incremental block digests: ``update`` with the file's bytes in any pieces, ``finish``."""

    def __init__(self, algo: str, block_size: int) -> None:
        self.algo = algo
        self.block_size = block_size
        self._hasher = new_hasher(algo)
        self._fill = 0
        self._size = 0
        self._hex: list[str] = []

    def update(self, data: Buffer) -> None:
        """Feed the next bytes of the file."""
        view = memoryview(data).cast("B")
        pos, total = 0, len(view)
        while pos < total:
            take = min(self.block_size - self._fill, total - pos)
            self._hasher.update(view[pos : pos + take])
            pos += take
            self._fill += take
            if self._fill == self.block_size:
                self._hex.append(self._hasher.hexdigest())
                self._hasher = new_hasher(self.algo)
                self._fill = 0
        self._size += total

    def finish(self) -> BlockDigests:
        """The digests of every block fed so far (the last one may be short)."""
        hexes = list(self._hex)
        if self._fill:
            hexes.append(self._hasher.hexdigest())
        return BlockDigests(self.algo, self.block_size, self._size, "".join(hexes))


def _shard_digests(shard: ShardInfo) -> BlockDigests:
    digests = shard.block_digests
    if digests is None:
        raise ConfigError(
            f"shard {shard.stored.basename} has no per-block digests (compressed, or written "
            "without them); fetch the whole shard and verify its file hash instead"
        )
    return digests


def blocks_for_range(shard: ShardInfo, start: int, end: int) -> BlockRange:
    """The blocks covering bytes ``[start, end)`` of ``shard``'s file, and the aligned range.

    A ranged reader fetches ``[r.start, r.end)`` (whole blocks, the last one possibly short
    at the end of the file) so that :func:`verify_range` can check every byte it will use::

        r = blocks_for_range(shard, sample_begin, sample_end)
        data = fetch(key, r.start, r.end)            # one HTTP Range request
        verify_range(shard, r.start, data)           # CorruptShardError if any block is bad

    Raises :class:`ConfigError` for an empty or negative range or a shard without block
    digests, :class:`CorruptShardError` when the range runs past the file's recorded size.
    """
    digests = _shard_digests(shard)
    if not 0 <= start < end:
        raise ConfigError(f"shard {shard.raw_data.basename}: bad byte range [{start}, {end})")
    if end > digests.file_size:
        raise CorruptShardError(
            f"shard {shard.raw_data.basename}: byte range [{start}, {end}) runs past the end of "
            f"the file ({digests.file_size} bytes in the index); its offsets do not fit the index"
        )
    size = digests.block_size
    first, last = start // size, (end - 1) // size
    return BlockRange(first, last, first * size, min((last + 1) * size, digests.file_size))


def verify_range(shard: ShardInfo, offset: int, data: Buffer) -> None:
    """Check bytes ``data`` read at ``offset`` of ``shard``'s file against its block digests.

    ``offset`` must be a block boundary and ``data`` must end on one or at the end of the
    file (use :func:`blocks_for_range`); otherwise :class:`ConfigError`. A block whose
    digest differs raises :class:`CorruptShardError` naming the shard, the block and its
    byte range; data running past the file's recorded end raises it too. A digest in the
    index that is not lowercase hex raises :class:`FormatError` (the index is at fault).
    """
    digests = _shard_digests(shard)
    name = shard.raw_data.basename
    size, view = digests.block_size, memoryview(data).cast("B")
    end = offset + len(view)
    if offset < 0 or offset % size:
        raise ConfigError(f"shard {name}: offset {offset} is not a multiple of the block size")
    if end > digests.file_size:
        raise CorruptShardError(
            f"shard {name}: {len(view)} bytes at offset {offset} run past the end of the file "
            f"({digests.file_size} bytes in the index)"
        )
    if end % size and end != digests.file_size:
        raise ConfigError(
            f"shard {name}: range [{offset}, {end}) ends inside block {end // size}; "
            "fetch whole blocks (blocks_for_range)"
        )
    first = offset // size
    one_shot = _ONE_SHOT.get(digests.algo)
    for k in range(-(-len(view) // size)):
        chunk = view[k * size : (k + 1) * size]
        actual = one_shot(chunk) if one_shot else hash_bytes(digests.algo, chunk)
        expected = digests.digest(first + k)
        if actual != expected:
            if not is_lower_hex(expected):
                raise FormatError(
                    f"shard {name}: field 'hashes' entry {digests.key!r} holds a digest that "
                    f"is not lowercase hex ({expected!r})"
                )
            lo, hi = digests.span(first + k)
            raise CorruptShardError(
                f"shard {name}: block {first + k} (bytes {lo}-{hi}) has {digests.algo} "
                f"{actual}, the index records {expected}; the bytes are corrupt, fetch them again"
            )


def blocks_of_spans(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], block_size: int
) -> npt.NDArray[np.int64]:
    """Sorted unique blocks that cover the byte spans ``[starts[i], ends[i])``.

    Empty spans cover nothing. Vectorized: a span crossing ``k`` blocks adds ``k`` ids.

    >>> blocks_of_spans(np.array([0, 10]), np.array([5, 25]), 8).tolist()
    [0, 1, 2, 3]
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    first = starts[keep] // block_size
    last = (ends[keep] - 1) // block_size
    counts = last - first + 1
    if counts.size == 0:
        return np.empty(0, dtype=np.int64)
    total = int(counts.sum())
    if total == counts.size:  # the common case: each sample inside one block
        out: npt.NDArray[np.int64] = np.unique(first)
        return out
    base = np.repeat(first - (np.cumsum(counts) - counts), counts)
    spread: npt.NDArray[np.int64] = np.unique(base + np.arange(total, dtype=np.int64))
    return spread


_ONE_SHOT = {"xxh3_64": xxhash.xxh3_64_hexdigest}
