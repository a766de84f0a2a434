"""Bytes of a block read: counted, verified against the block digests, written in place.

The pieces :class:`~shardstream.client.reads.partial.PartialShard` does its I/O with: the
per-process counters (:class:`BlockStats`), a ranged read checked against the index's
per-block digests and fetched again when corrupt (:func:`read_verified`), and the sparse
file calls that write blocks in place and free evicted ones (:func:`punch_hole`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.client.cache.layout import CacheLayout
from shardstream.client.reads.link import LinkEstimate
from shardstream.client.reads.ranges import coalesce
from shardstream.errors import CorruptShardError, HashMismatchError, ShardstreamError
from shardstream.mds import PieceTable, ShardInfo
from shardstream.storage import ObjectStore

__all__ = [
    "BlockStats",
    "blocks_in_place",
    "punch_hole",
    "pwrite_all",
    "read_header",
    "read_pieces",
    "read_verified",
]

log = logging.getLogger(__name__)

VERIFY_ATTEMPTS = 3
"""Fetches of a block whose bytes fail their digest before the shard is declared bad."""


class BlockStats:
    """Counters shared by the partial shards of one read path (bytes and requests)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes_fetched = 0
        self.corrupt_blocks = 0
        self.bytes_evicted = 0
        self.peer_bytes = 0
        """Bytes taken from another process's download file of the node cache, not fetched."""
        self.link = LinkEstimate()
        """Round trip and bandwidth seen by this read path's reads (sizes its bulk reads)."""

    def add(self, **deltas: int) -> None:
        """Add to the named counters."""
        with self.lock:
            for name, value in deltas.items():
                setattr(self, name, getattr(self, name) + value)


def read_peer_blocks(
    peers: Sequence[Path],
    info: ShardInfo,
    blocks: Sequence[int],
    block_size: int,
    *,
    stats: BlockStats,
) -> dict[int, bytes]:
    """Those of ``blocks`` (sorted) that other processes' files of the same shard hold,
    each matching its digest: ``{block: bytes}`` (counted as ``peer_bytes``); the rest
    must be fetched.

    Block by block, not all or nothing: a peer that fetched block 3 for a batch serves it to
    a process whose fill wants blocks 3..4, which then fetches only block 4. A peer's
    block may be a hole (zeros) or half written when read here: the digest check is what
    makes the bytes safe to use."""
    from shardstream.mds import verify_range  # with block digests (mds >= blocks)

    size = info.raw_data.bytes
    found: dict[int, bytes] = {}
    for path in peers:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # published or abandoned meanwhile
        try:
            wanted = [b for b in blocks if b not in found]
            with_data = np.asarray(_blocks_with_data(fd, wanted, block_size, size), np.int64)
            for a, b in coalesce(with_data, len(wanted)):
                start, end = a * block_size, min((b + 1) * block_size, size)
                data = os.pread(fd, end - start, start)
                view = memoryview(data)
                for block in range(a, b + 1):
                    at = block * block_size - start
                    piece = view[at : min(at + block_size, end - start)]
                    if len(piece) != min(block_size, size - block * block_size):
                        break  # the peer's file ends before this block: not there yet
                    try:
                        verify_range(info, start + at, piece)
                    except CorruptShardError:
                        continue  # not there yet
                    found[block] = data if len(piece) == len(data) else piece.tobytes()
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(found) == len(blocks):
            break
    if found:
        stats.add(peer_bytes=sum(len(b) for b in found.values()))
    return found


def blocks_in_place(
    fd: int, info: ShardInfo, blocks: Sequence[int], block_size: int, *, stats: BlockStats
) -> list[int]:
    """Those of ``blocks`` that the full-size file ``fd`` of the shard holds verified: each
    block's bytes checked against its digest where they lie, without copying them.

    The node cache's download file of a shard is shared: the process filling it and the
    node's other readers of the shard (who open the same file) write verified blocks into
    it. What one of them wrote is used by the others in place, mapped and checked (a
    block half written, or a hole, fails its digest: not there yet), never copied into a
    file of their own. Counted as ``peer_bytes``."""
    from shardstream.mds import verify_range  # with block digests (mds >= blocks)

    size = info.raw_data.bytes
    with_data = np.asarray(_blocks_with_data(fd, list(blocks), block_size, size), np.int64)
    found: list[int] = []
    for a, b in coalesce(with_data, len(with_data) or 1):
        start, end = a * block_size, min((b + 1) * block_size, size)
        try:  # block boundaries are page-aligned; the pages are faulted in at once
            mapped = mmap.mmap(
                fd, end - start, mmap.MAP_SHARED | _MAP_POPULATE, mmap.PROT_READ, offset=start
            )
        except (OSError, ValueError):
            continue  # the file is shorter than the shard (never for a partial's own file)
        with mapped, memoryview(mapped) as view:
            for block in range(a, b + 1):
                at = block * block_size - start
                try:
                    verify_range(info, start + at, view[at : min(at + block_size, end - start)])
                except CorruptShardError:
                    continue  # not there yet
                found.append(block)
    if found:
        tail = size - (found[-1] * block_size)
        stats.add(peer_bytes=(len(found) - 1) * block_size + min(block_size, tail))
    return found


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _blocks_with_data(fd: int, blocks: list[int], block_size: int, size: int) -> list[int]:
    """Those of ``blocks`` whose bytes in file ``fd`` are not all a hole (``SEEK_DATA``).

    A peer's download file is sparse: the blocks nobody wrote yet are holes, and reading
    them would copy megabytes of zeros only to fail their digests. Asking the file system
    where its data lies costs one ``lseek`` per block instead."""
    with_data: list[int] = []
    for block in blocks:
        start = block * block_size
        end = min(start + block_size, size)
        try:
            data_at = os.lseek(fd, start, os.SEEK_DATA)
        except OSError:  # ENXIO: no data from here to the end of the file
            break
        if data_at < end:
            with_data.append(block)
    return with_data


def offer_to_peers(peers: Sequence[Path], data: bytes | bytearray, start: int) -> None:
    """Write verified bytes this process fetched into the node's in-flight download files
    of the same shard, so that their fills find them there instead of fetching them again
    (identical bytes at the same offsets: harmless wherever the file is by now). A
    published cache file is never written: its verified marker covers it."""
    for path in peers:
        if CacheLayout.is_published(path):
            continue
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue  # published or abandoned meanwhile
        try:
            pwrite_all(fd, data, start)
        except OSError:
            pass
        finally:
            os.close(fd)


def read_verified(
    store: ObjectStore,
    key: str,
    info: ShardInfo,
    start: int,
    end: int,
    *,
    stats: BlockStats,
    verify: bool,
) -> bytes | bytearray:
    """Bytes ``[start, end)`` of shard ``key``, checked against its block digests when
    ``verify`` (fetched again when corrupt; :class:`HashMismatchError` after
    :data:`VERIFY_ATTEMPTS` corrupt fetches)."""
    from shardstream.mds import verify_range  # with block digests (mds >= blocks)

    def check(data: bytes | bytearray) -> None:
        if verify:
            verify_range(info, start, data)

    return _read_checked(store, key, info, (start, end), check, stats=stats)


def read_header(
    store: ObjectStore, key: str, info: ShardInfo, *, stats: BlockStats
) -> bytes | bytearray:
    """The header bytes of shard ``key`` alone, checked against the index's header digest
    (fetched again when corrupt, as :func:`read_verified`)."""
    digest = info.header_digest
    if digest is None:
        raise ShardstreamError(f"{key}: the index records no header digest")
    name = info.raw_data.basename
    return _read_checked(
        store, key, info, (0, digest.length), lambda d: digest.verify(d, name), stats=stats
    )


def read_pieces(
    store: ObjectStore,
    key: str,
    info: ShardInfo,
    table: PieceTable,
    pieces: tuple[int, int],
    *,
    stats: BlockStats,
) -> tuple[int, bytes | bytearray]:
    """``(offset, bytes)`` of pieces ``first..last`` (inclusive) of shard ``key``, checked
    against the piece table of its verified header (fetched again when corrupt, as
    :func:`read_verified`)."""
    first, last = pieces
    span = table.span(first, last)
    return span[0], _read_checked(
        store, key, info, span, lambda d: table.verify(first, d), stats=stats
    )


def _read_checked(
    store: ObjectStore,
    key: str,
    info: ShardInfo,
    span: tuple[int, int],
    check: Callable[[bytes | bytearray], None],
    *,
    stats: BlockStats,
) -> bytes | bytearray:
    size, (start, end) = info.raw_data.bytes, span
    for attempt in range(1, VERIFY_ATTEMPTS + 1):
        began = time.monotonic()
        data = store.read_range(key, start, end, expected_size=size)
        stats.link.observe(len(data), time.monotonic() - began)
        stats.add(requests=1, bytes_fetched=len(data))
        try:
            check(data)
            return data
        except CorruptShardError as exc:
            stats.add(corrupt_blocks=1)
            log.warning("%s (attempt %d of %d)", exc, attempt, VERIFY_ATTEMPTS)
            if attempt == VERIFY_ATTEMPTS:
                raise HashMismatchError(
                    f"{exc}; still corrupt after {attempt} fetches: the stored shard "
                    f"{key!r} does not match its index"
                ) from None
    raise AssertionError("unreachable")


def pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the pages of ``[offset, offset + length)`` of a file (Linux ``fallocate``)."""
    mode = _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE
    if _libc().fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise ShardstreamError(f"cannot free memory of a cacheless shard: {os.strerror(err)}")
