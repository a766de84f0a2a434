"""Bytes of a block read: counted, verified against the block digests, written in place.

The pieces :class:`~shardstream.client.reads.partial.PartialShard` does its I/O with: the
per-process counters (:class:`BlockStats`), a ranged read checked against the index's
per-block digests and fetched again when corrupt, under the re-fetch policy
(:data:`~shardstream.client.reads.refetch.REFETCH`: :func:`read_verified`), and the sparse
file calls that write blocks in place and free evicted ones (:func:`punch_hole`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from shardstream.client.reads.link import LinkEstimate
from shardstream.client.reads.refetch import REFETCH
from shardstream.errors import CorruptShardError, HashMismatchError, ShardstreamError
from shardstream.mds import PieceTable, ShardInfo
from shardstream.storage import ObjectStore

__all__ = [
    "BlockStats",
    "punch_hole",
    "pwrite_all",
    "read_header",
    "read_pieces",
    "read_verified",
]

log = logging.getLogger(__name__)


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
    ``verify`` (fetched again when corrupt; :class:`HashMismatchError` once
    :data:`~shardstream.client.reads.refetch.REFETCH` is spent)."""
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
    attempts = REFETCH.start()
    while True:
        began = time.monotonic()
        data = store.read_range(key, start, end, expected_size=size)
        stats.link.observe(len(data), time.monotonic() - began)
        stats.add(requests=1, bytes_fetched=len(data))
        try:
            check(data)
            return data
        except CorruptShardError as exc:
            stats.add(corrupt_blocks=1)
            made, delay = attempts.made, attempts.next_delay()
            log.warning("%s (attempt %d of %s)", exc, made, REFETCH.attempts)
            if delay is None:
                raise HashMismatchError(
                    f"{exc}; still corrupt after {made} fetches: the stored shard "
                    f"{key!r} does not match its index"
                ) from None
            time.sleep(delay)


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
