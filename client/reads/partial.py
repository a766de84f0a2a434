"""A shard being read by range: a full-size sparse file, filled block by block.

:class:`PartialShard` holds one shard's bytes while they arrive: a file of the shard's
full size (in the cache's private download folder, or an anonymous memory file in
cacheless mode) and a per-block state (missing, in flight, present). Missing blocks are
fetched as coalesced ranged reads on the process's :class:`RangeQueue`, each verified
against the builder's per-block digests before it is marked present, then written in
place; the shard's :class:`~shardstream.mds.ShardReader` memory-maps the file once its
header is present, so a batch reads its samples while the rest is still on the way.

Without per-block digests (older indexes), blocks cannot be verified on arrival; the
fetcher only builds a ``PartialShard`` for them when the user allowed it
(``CacheOptions.unverified_blocks="verify_on_completion"``), and the whole file is
checked against its hash once complete.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.io import (
    BlockStats,
    offer_to_peers,
    punch_hole,
    pwrite_all,
    read_header,
    read_peer_blocks,
    read_verified,
)
from shardstream.client.reads.pieces import PieceReads
from shardstream.client.reads.queue import DEMAND, RangeQueue

if TYPE_CHECKING:
    from shardstream.client.reads.peers import BlockClaims
from shardstream.client.reads.ranges import (
    blocks_between,
    blocks_of_samples,
    coalesce,
    header_bytes,
    lengthen,
    offsets_from_index,
)
from shardstream.errors import CorruptShardError, StorageError
from shardstream.hashing import verify_file
from shardstream.mds import ShardInfo, ShardReader
from shardstream.storage import ObjectStore

__all__ = ["IN_FLIGHT", "MISSING", "PRESENT", "BlockStats", "PartialShard"]

log = logging.getLogger(__name__)

MISSING, IN_FLIGHT, PRESENT = 0, 1, 2

BULK_MAX_BYTES = 64 << 20
"""Longest bulk read (0.75 s at 90 MB/s): a batch whose block is at its end waits for it."""


class PartialShard(PieceReads):
    """One shard's file, its block states and the reads that fill it (and, for a cold
    process's first batches, the pieces read ahead of the blocks: :class:`PieceReads`)."""

    def __init__(
        self,
        *,
        info: ShardInfo,
        key: str,
        store: ObjectStore,
        fd: int,
        path: Path,
        queue: RangeQueue,
        block_size: int,
        range_blocks: int,
        stats: BlockStats,
    ) -> None:
        self.info, self.key, self.store = info, key, store
        self.fd, self.path = fd, path
        self.size = info.raw_data.bytes
        self.block_size = block_size
        self.num_blocks = max(-(-self.size // block_size), 1)
        self._queue = queue
        self._range_blocks = range_blocks
        self._stats = stats
        self._digests = info.block_digests if hasattr(info, "block_digests") else None
        self.state = np.zeros(self.num_blocks, dtype=np.int8)
        self.last_use = np.zeros(self.num_blocks, dtype=np.int64)
        self.owner = np.full(self.num_blocks, -1, dtype=np.int64)
        """The read job each in-flight block belongs to."""
        self._jobs = 0
        self._queued: dict[int, int] = {}  # read jobs submitted and not started: priority
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._reader: ShardReader | None = None
        self._index_offsets: npt.NDArray[np.int64] | Literal[False] | None = None
        self._offsets_differ: bool | None = None
        self._header_blocks = np.empty(0, dtype=np.int64)
        self._reader_lock = threading.Lock()
        self.whole_lock = threading.Lock()
        """Held while the shard is read whole (one whole read, whoever asks first)."""
        self.peers: Callable[[], list[Path]] | None = None
        """Download files of this shard by other processes of the node (cache mode)."""
        self.claims: BlockClaims | None = None
        """Node-wide locks over this shard's blocks: a block another process is fetching
        is waited for and copied from its file, not fetched again."""
        self.offer_to: Callable[[], list[Path]] | None = None
        """The node cache's download files of this shard, into which blocks fetched here
        are also written (never another process's memory)."""
        self.node_shared = False
        """Whether this is the node cache's download file, where other processes of the
        node write verified blocks they fetched (a fill looks there before fetching)."""
        self.adopted_header: bytes | None = None
        """The header's bytes, read earlier by this process's memory copy of the shard (a
        fill that starts after a first batch need not fetch them again)."""
        self.bulk = False
        """Whether this process fetches every block of the shard (its cache fill): then
        look-ahead and fill reads are long ranges sized to the link (:meth:`bulk_blocks`)."""
        self._header_queued = False  # a header read is queued or running
        self._busy = 0  # runs in flight and threads waiting: the file stays open for them
        self._retired = False
        self._init_pieces(
            info.piece_spec if self._digests is not None and info.header_digest else None
        )
        os.ftruncate(fd, self.size)

    @property
    def verified_blocks(self) -> bool:
        """Whether each block is checked against a digest on arrival."""
        return self._digests is not None

    def present_bytes(self) -> int:
        """Bytes of the blocks present or on the way (what the file holds in memory or on
        disk once the reads in flight land)."""
        held = self.state != MISSING
        tail = self.size - (self.num_blocks - 1) * self.block_size
        return int(np.count_nonzero(held)) * self.block_size - (
            self.block_size - tail if held[-1] else 0
        )

    def missing_bytes(self, blocks: npt.NDArray[np.int64]) -> int:
        """Bytes of ``blocks`` that are neither present nor on the way (what fetching them
        adds to memory)."""
        return int(np.count_nonzero(self.state[blocks] == MISSING)) * self.block_size

    # -- requesting and waiting -----------------------------------------------------------

    def request(
        self, blocks: npt.NDArray[np.int64], priority: int = DEMAND, *, bulk: bool = False
    ) -> None:
        """Start fetching the missing ones of ``blocks`` (sorted, unique).

        A batch's request also takes over the background reads (fill) that hold its blocks
        and are queued but not started, whole, so a batch never waits behind the fill and
        a long range stays one request. With ``bulk`` (a shard this process fills whole:
        :attr:`bulk`), each run also takes the missing blocks after it, up to
        :meth:`bulk_blocks`.
        """
        jobs: list[tuple[int, int, int]] = []
        with self._cond:
            if self._error is not None:
                return
            take = self.state[blocks] == MISSING
            todo = blocks[take]
            behind = [job for job, p in self._queued.items() if p > priority]
            if priority == DEMAND and behind:
                waiting = np.asarray(behind, dtype=np.int64)
                late = (self.state[blocks] == IN_FLIGHT) & np.isin(self.owner[blocks], waiting)
                if late.any():  # whole queued jobs move up: a long range stays one request
                    jobs_late = np.unique(self.owner[blocks[late]])
                    moved = np.flatnonzero(
                        (self.state == IN_FLIGHT) & np.isin(self.owner, jobs_late)
                    )
                    todo = np.union1d(todo, moved)
                    bulk = True  # the fill's long ranges stay long
            self.state[todo] = IN_FLIGHT
            longest = self.bulk_blocks() if bulk and self.bulk else self._range_blocks
            runs = coalesce(todo, longest)
            if longest > self._range_blocks:
                free = self.state == MISSING
                runs = lengthen(runs, free, longest)
                self.state[~free & (self.state == MISSING)] = IN_FLIGHT
            for first, last in runs:
                job = self._jobs = self._jobs + 1
                self.owner[first : last + 1] = job
                self._queued[job] = priority
                jobs.append((first, last, job))
            self._busy += len(jobs)
        for first, last, job in jobs:
            self._queue.submit(priority, functools.partial(self._fetch, first, last, job))

    def bulk_blocks(self) -> int:
        """Blocks of one bulk read: :data:`~shardstream.client.reads.link.BULK_RTTS` round trips
        of transfer at the measured link, at least ``range_bytes``, at most
        :data:`BULK_MAX_BYTES` (a batch may wait for a whole range)."""
        longest = self._stats.link.bulk_bytes(self._range_blocks * self.block_size, BULK_MAX_BYTES)
        return max(self._range_blocks, -(-longest // self.block_size))

    def wait(
        self, blocks: npt.NDArray[np.int64], priority: int = DEMAND, *, bulk: bool = False
    ) -> None:
        """Fetch ``blocks`` if needed and return once all are present (or raise why not)."""
        self.request(blocks, priority, bulk=bulk)
        self._wait_until(lambda: bool((self.state[blocks] == PRESENT).all()))

    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` (called with ``_cond`` held) is true; raises the
        shard's error if it fails first."""
        with self._cond:
            self._busy += 1
            try:
                while True:
                    if self._error is not None:
                        raise self._error
                    if ready():
                        return
                    self._cond.wait()
            finally:
                self._done_one()

    def wait_all(self, priority: int) -> None:
        """Fetch every missing block at ``priority`` and return once the file is complete.

        Two ranged reads at a time: blocks not yet requested stay free for the batches to
        request at their own (higher) priority, instead of queueing behind the fill.
        """
        while True:
            with self._cond:
                missing = np.flatnonzero(self.state == MISSING)
            if missing.size == 0:
                break
            runs = coalesce(missing, self.bulk_blocks() if self.bulk else self._range_blocks)[:2]
            batch = np.concatenate([np.arange(a, b + 1) for a, b in runs])
            self.wait(batch, priority, bulk=True)
        self.wait(np.arange(self.num_blocks, dtype=np.int64))

    def fail(self, error: BaseException) -> None:
        """Wake every waiter with ``error`` (the fetcher is closing, or the shard is bad)."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def _done_one(self) -> None:
        """One run or waiter finished (``_cond`` held)."""
        self._busy -= 1

    def retire(self) -> None:
        """Stop tracking this partial (another copy took over). Threads still using it
        are served; its file closes when the last reference goes (``__del__``)."""
        self._retired = True

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError):
            self.close_file()

    def close_file(self) -> None:
        """Close the file once (later reads and writes of this partial are skipped)."""
        with self._cond:
            if self.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                self.fd = -1

    def _fetch(self, first: int, last: int, job: int) -> None:
        try:
            with self._cond:
                self._queued.pop(job, None)
                # Blocks a batch's request took over are fetched by that request instead.
                mine = np.flatnonzero(self.owner[first : last + 1] == job) + first
            for a, b in coalesce(mine, last - first + 1):  # one request, as submitted
                self._fetch_run(a, b)
        finally:
            with self._cond:
                self._done_one()

    def _fetch_run(self, first: int, last: int) -> None:
        claim = self.claims.hold(first, last) if self.claims is not None else None
        try:
            with claim if claim is not None else contextlib.nullcontext():
                self._fetch_claimed(first, last)
        except BaseException as exc:
            with self._cond:
                self.state[first : last + 1] = MISSING
            self.fail(exc)
            return
        with self._cond:
            self.state[first : last + 1] = PRESENT
            self._cond.notify_all()

    def _fetch_claimed(self, first: int, last: int) -> None:
        """Blocks ``first..last``: each from a peer's file where one holds it verified, the
        rest from the store (coalesced); all written into this shard's file."""
        pieces: list[tuple[int, bytes | bytearray]] = []
        missing = np.arange(first, last + 1, dtype=np.int64)
        if self._digests is not None:  # verified blocks only
            if self.peers is not None:
                peers = self.peers()
            else:  # written here by another process of the node
                peers = [self.path] if self.node_shared else []
            if peers:
                found = read_peer_blocks(
                    peers, self.info, (first, last), self.block_size, stats=self._stats
                )
                pieces = [(b * self.block_size, data) for b, data in found.items()]
                missing = missing[~np.isin(missing, list(found))]
        verify = self._digests is not None
        for a, b in coalesce(missing, last - first + 1):
            span = (a * self.block_size, min((b + 1) * self.block_size, self.size))
            data = read_verified(
                self.store, self.key, self.info, *span, stats=self._stats, verify=verify
            )
            if verify and self.offer_to is not None:
                offer_to_peers(self.offer_to(), data, span[0])
            pieces.append((span[0], data))
        with self._cond:  # the file may be closed meanwhile: never write a reused fd
            if self.fd < 0:
                raise StorageError(f"{self.key}: the partial shard was closed")
            for offset, data in pieces:
                pwrite_all(self.fd, data, offset)

    # -- reading --------------------------------------------------------------------------

    def request_header(self) -> None:
        """Start fetching the header: its own bytes where the index has their digest, else
        its blocks (the config part guessed at 4 KiB)."""
        if self._reader is not None:
            return
        if self._digests is not None and self.info.header_digest is not None:
            with self._cond:
                if self._header_queued:
                    return
                self._header_queued = True
            self._queue.submit(DEMAND, self._open_quietly)
        else:
            self.request(self._first_blocks())

    def _open_quietly(self) -> None:
        """Open the reader ahead of use; a failure is raised again to the reader's caller."""
        try:
            self.reader()
        except Exception as exc:  # reader() is called again where the shard is read
            log.debug("%s: opening ahead failed: %s", self.key, exc)
        finally:
            with self._cond:
                self._header_queued = False

    def _first_blocks(self) -> npt.NDArray[np.int64]:
        return blocks_between(
            self.num_blocks,
            self.block_size,
            0,
            min(header_bytes(self.info.samples) + 4096, self.size),
        )

    def has_reader(self) -> bool:
        """Whether the header is here (the reader is open)."""
        return self._reader is not None

    def reader(self) -> ShardReader:
        """The shard's reader over this file (fetches the header first if needed)."""
        if self._reader is not None:
            return self._reader
        with self._reader_lock:  # one builder; the others find its reader
            if self._reader is None:
                self._reader = self._open_reader()
        return self._reader

    def _open_reader(self) -> ShardReader:
        head = self.info.header_digest if self._digests is not None else None
        if head is not None:  # never waits on the range queue: safe in its threads
            # The header's own bytes, verified against its digest: a few KiB where block 0
            # is MBs. Its blocks stay pinned (never evicted) while the shard is open.
            held, in_file = self.adopted_header, False
            with self._cond:  # read whole already (a small shard): its own bytes
                if held is None and self.fd >= 0 and self.complete():
                    held, in_file = os.pread(self.fd, head.length, 0), True
            if held is not None:
                head.verify(held, self.info.raw_data.basename)
            data = held or read_header(self.store, self.key, self.info, stats=self._stats)
            self._learn_pieces(data)
            with self._cond:
                if self.fd < 0:
                    raise StorageError(f"{self.key}: the partial shard was closed")
                if not in_file:
                    pwrite_all(self.fd, data, 0)
            self._header_blocks = blocks_between(self.num_blocks, self.block_size, 0, head.length)
            return ShardReader(self.path, self.info)
        fixed = header_bytes(self.info.samples)
        first = self._first_blocks()
        self._header_blocks = first
        self.wait(first)
        with self._cond:
            if self.fd < 0:
                raise StorageError(f"{self.key}: the partial shard was closed")
            begin = int.from_bytes(os.pread(self.fd, 4, 4), "little")  # offsets[0]
        if begin > self.size:
            raise CorruptShardError(
                f"{self.key}: header says samples start at byte {begin}, past the end of the "
                f"{self.size}-byte shard"
            )
        rest = blocks_between(self.num_blocks, self.block_size, 0, max(begin, fixed))
        self.wait(rest)
        self._header_blocks = rest
        return ShardReader(self.path, self.info)

    def blocks_for(self, local: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Blocks holding samples ``local``: from the header's offsets, or before the
        header is here, from the index alone where that determines them
        (:meth:`index_offsets`), so a first batch requests its blocks in the same round
        trip as the headers. Readers check them against the header (``BlockDemand.need``)."""
        if self._reader is None:
            offsets = self.index_offsets()
            if offsets is not None:
                return blocks_of_samples(offsets, local, self.block_size)
        return blocks_of_samples(self.reader().offsets, local, self.block_size)

    def index_offsets(self) -> npt.NDArray[np.int64] | None:
        """:func:`~shardstream.client.reads.ranges.offsets_from_index` of this shard (once)."""
        if self._index_offsets is None:
            found = offsets_from_index(self.info) if self._digests is not None else None
            self._index_offsets = False if found is None else found
        return None if self._index_offsets is False else self._index_offsets

    def index_offsets_differ(self) -> bool:
        """Whether the header (read now) disagrees with the index's offsets, so blocks
        chosen from those before it came may miss bytes; decided once per shard."""
        if self._offsets_differ is None:
            guess = self.index_offsets()
            same = guess is None or np.array_equal(guess, self.reader().offsets)
            self._offsets_differ = not same
        return self._offsets_differ

    def header_blocks(self) -> npt.NDArray[np.int64]:
        """Blocks of the header (pinned: never evicted while the shard is open)."""
        return self._header_blocks

    def complete(self) -> bool:
        """Whether every block is present."""
        return bool((self.state == PRESENT).all())

    @property
    def verified_on_arrival(self) -> bool:
        """Whether every block is checked against its digest before it is marked present
        (the index has block digests): a complete file then holds verified bytes only."""
        return self._digests is not None

    def verify_whole(self) -> None:
        """Check the complete file against the shard's whole-file hash (blocks that were
        not digest-verified on arrival); :class:`HashMismatchError` if it differs."""
        if not self.verified_on_arrival and self.info.raw_data.hashes:
            verify_file(self.path, self.info.raw_data.hashes, what=self.key)

    def evict(self, blocks: npt.NDArray[np.int64]) -> int:
        """Drop present ``blocks`` from memory (punch holes); returns the bytes freed."""
        freed = 0
        with self._cond:
            for block in blocks.tolist():
                if self.state[block] != PRESENT or self.fd < 0:
                    continue
                start = block * self.block_size
                length = min(self.block_size, self.size - start)
                punch_hole(self.fd, start, length)
                self.state[block] = MISSING
                self.forget_pieces(start, start + length)
                freed += length
        self._stats.add(bytes_evicted=freed)
        return freed

    def close(self) -> None:
        """Close the file (a reader's mapping stays valid for arrays still using it)."""
        self.fail(StorageError(f"{self.key}: the reader was closed"))
        self.close_file()
