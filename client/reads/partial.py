"""A shard being read by range: a full-size sparse file, filled block by block.

:class:`PartialShard` holds one shard's bytes while they arrive: a file of the shard's
full size (in the cache's private download folder, or an anonymous memory file in
cacheless mode) and the state of each block (:class:`~.blocks.BlockState`: missing, in
flight, present). Missing blocks are fetched as coalesced ranged reads on the process's
:class:`RangeQueue`, each verified against the builder's per-block digests before it is
marked present, then written in place; the shard's :class:`~shardstream.mds.ShardReader`
memory-maps the file once its header is present (:mod:`.header`), so a batch reads its
samples while the rest is still on the way. A cold process's first batches read 64 KiB
pieces instead (:class:`~.pieces.PieceReader`, a component of the partial).

Invariant: the block and piece states, the file and the read jobs change only in this
class and its components (:class:`~.requests.BlockRequests` plans the read jobs,
:class:`~.pieces.PieceReader` reads pieces), under the one condition the partial hands
them when it makes them; a block is ``PRESENT`` only once its (verified) bytes are in the
file. Other objects configure a partial when they make it (:class:`NodeSharing`) and ask
it to act; none takes its lock.

Without per-block digests (older indexes), blocks cannot be verified on arrival; the
read path only builds a ``PartialShard`` for them when the user allowed it
(``ReadOptions.unverified_blocks="verify_on_completion"``), and the whole file is
checked against its hash once complete.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.block_sources import NodeSharing, read_blocks
from shardstream.client.reads.blocks import BlockTable
from shardstream.client.reads.header import ShardHeader
from shardstream.client.reads.io import BlockStats, punch_hole, pwrite_all
from shardstream.client.reads.pieces import PieceReader
from shardstream.client.reads.queue import DEMAND, RangeQueue
from shardstream.client.reads.requests import BlockRequests, ReadJob
from shardstream.errors import StorageError
from shardstream.hashing import verify_file
from shardstream.mds import ShardInfo, ShardReader
from shardstream.storage import ObjectStore

__all__ = ["PartialShard"]

I64 = npt.NDArray[np.int64]

NO_SHARING = NodeSharing()
"""A partial that neither copies from nor offers to other processes."""


class PartialShard:
    """One shard's file, its block states and the reads that fill it (and, for a cold
    process's first batches, the pieces read ahead of the blocks: :attr:`pieces`)."""

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
        sharing: NodeSharing = NO_SHARING,
        bulk: bool = False,
    ) -> None:
        self.info, self.key, self.store = info, key, store
        self.fd, self.path = fd, path
        self.size = info.raw_data.bytes
        self.block_size = block_size
        self.num_blocks = max(-(-self.size // block_size), 1)
        self._queue = queue
        self.stats = stats
        """The read path's counters (requests, bytes, the link estimate)."""
        self._digests = info.block_digests if hasattr(info, "block_digests") else None
        self.sharing = sharing
        self._blocks = BlockTable(self.num_blocks)
        self._requests = BlockRequests(
            self._blocks,
            block_size=block_size,
            range_blocks=range_blocks,
            link=stats.link,
            bulk=bulk,  # every block is fetched here: long reads sized to the link
        )
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._whole_lock = threading.Lock()  # one whole read, whoever asks first
        self._retired = False
        spec = info.piece_spec if self._digests is not None and info.header_digest else None
        self.pieces = PieceReader(
            self, spec, cond=self._cond, blocks=self._blocks, range_blocks=range_blocks
        )
        """Reads a cold batch's samples by piece, ahead of their blocks."""
        self.header = ShardHeader(self)
        os.ftruncate(fd, self.size)

    @property
    def verified_on_arrival(self) -> bool:
        """Whether every block is checked against its digest before it is marked present
        (the index has block digests): a complete file then holds verified bytes only."""
        return self._digests is not None

    def present_bytes(self) -> int:
        """Bytes of the blocks present or on the way (what the file holds in memory or on
        disk once the reads in flight land)."""
        held = ~self._blocks.missing()
        tail = self.size - (self.num_blocks - 1) * self.block_size
        return int(np.count_nonzero(held)) * self.block_size - (
            self.block_size - tail if held[-1] else 0
        )

    def missing_bytes(self, blocks: I64) -> int:
        """Bytes of ``blocks`` that are neither present nor on the way (what fetching them
        adds to memory)."""
        return int(np.count_nonzero(self._blocks.missing(blocks))) * self.block_size

    def present_blocks(self) -> I64:
        """The blocks in the file now."""
        return self._blocks.present_ids()

    def complete(self) -> bool:
        """Whether every block is present."""
        return self._blocks.all_present()

    # -- requesting and waiting -----------------------------------------------------------

    def request(self, blocks: I64, priority: int = DEMAND, *, bulk: bool = False) -> None:
        """Start fetching the missing ones of ``blocks`` (sorted, unique) as ranged reads
        (:class:`~.requests.BlockRequests`: a batch's request takes over the fill's queued
        reads of its blocks; ``bulk`` reads long ranges in a shard this process fills)."""
        with self._cond:
            if self._error is not None:
                return
            jobs = self._requests.plan(blocks, priority, bulk=bulk)
        for job in jobs:
            self._queue.submit(job.priority, functools.partial(self._fetch, job))

    def wait(self, blocks: I64, priority: int = DEMAND, *, bulk: bool = False) -> None:
        """Fetch ``blocks`` if needed and return once all are present (or raise why not)."""
        self.request(blocks, priority, bulk=bulk)
        self.wait_until(lambda: self._blocks.all_present(blocks))

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Return once ``ready()`` (called with ``_cond`` held) is true; raises the
        shard's error if it fails first."""
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if ready():
                    return
                self._cond.wait()

    def wait_all(self, priority: int) -> None:
        """Fetch every missing block at ``priority`` and return once the file is complete.

        Two ranged reads at a time: blocks not yet requested stay free for the batches to
        request at their own (higher) priority, instead of queueing behind the fill.
        """
        while True:
            with self._cond:
                missing = np.flatnonzero(self._blocks.missing())
            if missing.size == 0:
                break
            runs = self._requests.fill_runs(missing)
            batch = np.concatenate([np.arange(a, b + 1) for a, b in runs])
            self.wait(batch, priority, bulk=True)
        self.wait(np.arange(self.num_blocks, dtype=np.int64))

    @property
    def failed(self) -> bool:
        """Whether the shard failed or its reader closed (exact with the condition held)."""
        return self._error is not None

    def fail(self, error: BaseException) -> None:
        """Wake every waiter with ``error`` (the read path is closing, or the shard is bad)."""
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

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

    def close(self) -> None:
        """Close the file (a reader's mapping stays valid for arrays still using it)."""
        self.fail(StorageError(f"{self.key}: the reader was closed"))
        self.close_file()

    def _fetch(self, job: ReadJob) -> None:
        with self._cond:
            runs = self._requests.start(job)
        for first, last in runs:
            self._fetch_run(first, last)

    def _fetch_run(self, first: int, last: int) -> None:
        claims = self.sharing.claims
        claim = claims.hold(first, last) if claims is not None else None
        try:
            with claim if claim is not None else contextlib.nullcontext():
                self._fetch_claimed(first, last)
        except BaseException as exc:
            with self._cond:
                self._blocks.lose(slice(first, last + 1))
            self.fail(exc)
            return
        with self._cond:
            self._blocks.arrive(slice(first, last + 1))
            self._cond.notify_all()

    def _fetch_claimed(self, first: int, last: int) -> None:
        """Blocks ``first..last`` into this shard's file (:func:`~.block_sources.read_blocks`)."""
        self.write(read_blocks(self, first, last))

    # -- the file ---------------------------------------------------------------------

    def write(self, pieces: list[tuple[int, bytes | bytearray]]) -> None:
        """Write ``(offset, bytes)`` pieces into the file; :class:`StorageError` once it
        is closed (never a reused fd), also for no pieces."""
        with self._cond:
            if self.fd < 0:
                raise StorageError(f"{self.key}: the partial shard was closed")
            for offset, data in pieces:
                pwrite_all(self.fd, data, offset)

    def read_at(self, offset: int, length: int) -> bytes:
        """``length`` bytes of the file at ``offset``; :class:`StorageError` once closed."""
        with self._cond:
            if self.fd < 0:
                raise StorageError(f"{self.key}: the partial shard was closed")
            return os.pread(self.fd, length, offset)

    def read_if_complete(self, length: int) -> bytes | None:
        """The file's first ``length`` bytes if every block is here, else ``None``."""
        with self._cond:
            if self.fd >= 0 and self.complete():
                return os.pread(self.fd, length, 0)
        return None

    def submit(self, priority: int, job: Callable[[], None]) -> None:
        """Run ``job`` on the process's range queue at ``priority``."""
        self._queue.submit(priority, job)

    # -- the header, and reading samples ------------------------------------------------

    def reader(self) -> ShardReader:
        """The shard's reader over this file (fetches the header first if needed:
        :class:`~.header.ShardHeader`)."""
        return self.header.reader()

    # -- whole files, copies, eviction --------------------------------------------------

    def load_once(self, load: Callable[[], None]) -> None:
        """Run ``load`` (a whole read: :meth:`write_whole`) unless the file is complete;
        one at a time, so whoever asks first reads it and the others find it done."""
        with self._whole_lock:
            if not self.complete():
                load()

    def write_whole(self, packed: bytes, compression: str | None) -> None:
        """The whole shard's (verified) bytes, compressed as ``compression``: written,
        every block present."""
        if compression is not None:
            from shardstream.mds import decompress_stream

            with open(self.path, "r+b") as out:
                decompress_stream(compression, io.BytesIO(packed), out)
        else:
            os.pwrite(self.fd, packed, 0)
        with self._cond:
            self._blocks.arrive(slice(None))
            self._cond.notify_all()

    def copy_present(self) -> tuple[bytes | None, list[tuple[int, bytes]]]:
        """``(header bytes if read, [(block, bytes), ...])`` of what this file holds now."""
        head = self.info.header_digest
        header, blocks = None, []
        with self._cond:
            if head is not None and self.header.reader_if_open() is not None and self.fd >= 0:
                header = os.pread(self.fd, head.length, 0)  # checked again on use
            for block in self._blocks.present_ids().tolist():
                start = block * self.block_size
                length = min(self.block_size, self.size - start)
                data = os.pread(self.fd, length, start) if self.fd >= 0 else b""
                if len(data) == length:
                    blocks.append((block, data))
        return header, blocks

    def adopt(self, early: PartialShard) -> None:
        """Take the blocks ``early`` (this process's memory copy of the same shard) holds,
        and its header where it read one: not fetched twice."""
        if early.block_size != self.block_size:
            return
        header, blocks = early.copy_present()
        with self._cond:
            if header is not None:
                self.header.adopt(header)
            for block, data in blocks:
                os.pwrite(self.fd, data, block * self.block_size)
                self._blocks.arrive(np.array([block], dtype=np.int64))

    def see_downloads(self, downloads: Callable[[], list[Path]]) -> None:
        """Cache mode, before this process's fill started: also copy blocks from the node
        cache's download files of the shard (``downloads``), and write what is fetched
        here into them (once per partial)."""
        with self._cond:
            if self.sharing.offer_to is None:
                self.sharing = self.sharing.with_downloads(downloads)

    def verify_whole(self) -> None:
        """Check the complete file against the shard's whole-file hash (blocks that were
        not digest-verified on arrival); :class:`HashMismatchError` if it differs."""
        if not self.verified_on_arrival and self.info.raw_data.hashes:
            verify_file(self.path, self.info.raw_data.hashes, what=self.key)

    def evict(self, blocks: I64) -> int:
        """Drop present ``blocks`` from memory (punch holes); returns the bytes freed.
        Never in the node cache's download file (other processes' blocks): nothing freed."""
        freed = 0
        if self.sharing.node_shared:
            return 0
        with self._cond:
            for block in blocks.tolist():
                if not self._blocks.present(block) or self.fd < 0:
                    continue
                start = block * self.block_size
                length = min(self.block_size, self.size - start)
                punch_hole(self.fd, start, length)
                self._blocks.lose(block)
                self.pieces.forget(start, start + length)
                freed += length
        self.stats.add(bytes_evicted=freed)
        return freed
