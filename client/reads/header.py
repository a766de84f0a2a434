"""A partial shard's header: opened first, from its own bytes where the index has their digest.

A ranged reader needs a shard's header (its sample offsets) before it can tell which
blocks hold a sample. :class:`ShardHeader` is the component of a
:class:`~shardstream.client.reads.partial.PartialShard` that fetches it (a few KiB checked
against the index's header digest, else the first blocks), opens the
:class:`~shardstream.mds.ShardReader` over the partial's file once it is there, and answers
which blocks hold given samples: from the header's offsets, or before the header came,
from the index alone where every column has a fixed size (so a first batch requests its
blocks in the same round trip as the headers). It uses only the partial's public methods:
its file and block states stay the partial's.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.io import read_header
from shardstream.client.reads.queue import DEMAND
from shardstream.client.reads.ranges import (
    blocks_between,
    blocks_of_samples,
    header_bytes,
    offsets_from_index,
)
from shardstream.errors import CorruptShardError
from shardstream.mds import ShardReader

if TYPE_CHECKING:
    from shardstream.client.reads.partial import PartialShard
    from shardstream.mds import HeaderDigest

__all__ = ["ShardHeader"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]


class ShardHeader:
    """The header and reader of one partial shard (see the module docstring)."""

    def __init__(self, partial: PartialShard) -> None:
        self._partial = partial
        self._reader: ShardReader | None = None
        self._reader_lock = threading.Lock()  # one opener; the others find its reader
        self._queued_lock = threading.Lock()
        self._queued = False  # a header read is queued or running
        self._index_offsets: I64 | Literal[False] | None = None
        self._offsets_differ: bool | None = None
        self.blocks = np.empty(0, dtype=np.int64)
        """Blocks of the header (pinned: never evicted while the shard is open)."""
        self.adopted: bytes | None = None
        """The header's bytes, read earlier by this process's memory copy of the shard (a
        fill that starts after a first batch need not fetch them again)."""

    def adopt(self, header: bytes) -> None:
        """Use ``header`` (read by this process's memory copy; checked on use) instead of
        fetching it."""
        self.adopted = header

    def reader_if_open(self) -> ShardReader | None:
        """The reader if the header is here, else ``None`` (never fetches)."""
        return self._reader

    def reader(self) -> ShardReader:
        """The shard's reader over the partial's file (fetches the header first if needed)."""
        if self._reader is not None:
            return self._reader
        with self._reader_lock:
            if self._reader is None:
                self._reader = self._open()
        return self._reader

    def request(self) -> None:
        """Start fetching the header: its own bytes where the index has their digest, else
        its blocks (the config part guessed at 4 KiB)."""
        p = self._partial
        if self._reader is not None:
            return
        if p.verified_on_arrival and p.info.header_digest is not None:
            with self._queued_lock:
                if self._queued:
                    return
                self._queued = True
            p.submit(DEMAND, self._open_quietly)
        else:
            p.request(self._first_blocks())

    def _open_quietly(self) -> None:
        """Open the reader ahead of use; a failure is raised again to the reader's caller."""
        try:
            self.reader()
        except Exception as exc:  # reader() is called again where the shard is read
            log.debug("%s: opening ahead failed: %s", self._partial.key, exc)
        finally:
            with self._queued_lock:
                self._queued = False

    def _first_blocks(self) -> I64:
        p = self._partial
        end = min(header_bytes(p.info.samples) + 4096, p.size)
        return blocks_between(p.num_blocks, p.block_size, 0, end)

    def _open(self) -> ShardReader:
        p = self._partial
        head = p.info.header_digest if p.verified_on_arrival else None
        if head is not None:  # never waits on the range queue: safe in its threads
            # The header's own bytes, verified against its digest: a few KiB where block 0
            # is MBs. Its blocks stay pinned (never evicted) while the shard is open.
            held, in_file = self.adopted, False
            if held is None:  # read whole already (a small shard): its own bytes
                held = p.read_if_complete(head.length)
                in_file = held is not None
            if held is None and p.sharing.node_shared:
                held = _written_by_another(p, head)  # the node's download file
                in_file = held is not None
            if held is not None:
                head.verify(held, p.info.raw_data.basename)
            data = held or read_header(p.store, p.key, p.info, stats=p.stats)
            p.pieces.learn(data, p.info.raw_data.basename)
            p.write([] if in_file else [(0, data)])  # raises if it was closed meanwhile
            self.blocks = blocks_between(p.num_blocks, p.block_size, 0, head.length)
            return ShardReader(p.path, p.info)
        fixed = header_bytes(p.info.samples)
        first = self._first_blocks()
        self.blocks = first
        p.wait(first)
        begin = int.from_bytes(p.read_at(4, 4), "little")  # offsets[0]
        if begin > p.size:
            raise CorruptShardError(
                f"{p.key}: header says samples start at byte {begin}, past the end of the "
                f"{p.size}-byte shard"
            )
        rest = blocks_between(p.num_blocks, p.block_size, 0, max(begin, fixed))
        p.wait(rest)
        self.blocks = rest
        return ShardReader(p.path, p.info)

    def blocks_for(self, local: npt.ArrayLike) -> I64:
        """Blocks holding samples ``local``: from the header's offsets, or before the
        header is here, from the index alone where that determines them
        (:meth:`index_offsets`), so a first batch requests its blocks in the same round
        trip as the headers. Readers check them against the header (``BlockDemand.need``)."""
        if self._reader is None:
            offsets = self.index_offsets()
            if offsets is not None:
                return blocks_of_samples(offsets, local, self._partial.block_size)
        return blocks_of_samples(self.reader().offsets, local, self._partial.block_size)

    def index_offsets(self) -> I64 | None:
        """:func:`~shardstream.client.reads.ranges.offsets_from_index` of this shard (once)."""
        if self._index_offsets is None:
            p = self._partial
            found = offsets_from_index(p.info) if p.verified_on_arrival else None
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


def _written_by_another(partial: PartialShard, head: HeaderDigest) -> bytes | None:
    """The header's bytes in ``partial``'s file if another process of the node wrote them
    there already (they match the digest), else ``None``: a header costs a round trip."""
    data = partial.read_at(0, head.length)
    try:
        head.verify(data, partial.info.raw_data.basename)
    except CorruptShardError:
        return None
    return data
