"""The read jobs of one partial shard: which blocks each one holds, and how long it is.

A :class:`~shardstream.client.reads.partial.PartialShard` fetches its missing blocks as
coalesced runs, each one job on the process's range queue. :class:`BlockRequests` is the
partial's component that plans them:

* a request starts the missing ones of its blocks (-> ``IN_FLIGHT``), in runs of at most
  ``range_bytes``, or, for a shard this process fills whole (``bulk``), of a bulk read
  sized to the link (:meth:`BlockRequests.bulk_blocks`), each run lengthened over the
  free blocks after it;
* a batch's request (``DEMAND``) also takes over the background jobs (fill) that hold its
  blocks and are queued but not started, whole: a batch never waits behind the fill, and
  a long range stays one request;
* a job that starts reads only the blocks still its own (:meth:`BlockRequests.start`).

It holds no lock and does no I/O: the partial calls it with its condition held, and
submits and runs the jobs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.blocks import BlockTable
from shardstream.client.reads.link import LinkEstimate
from shardstream.client.reads.queue import DEMAND
from shardstream.client.reads.ranges import coalesce, lengthen

__all__ = ["BULK_MAX_BYTES", "BlockRequests", "ReadJob"]

I64 = npt.NDArray[np.int64]

BULK_MAX_BYTES = 64 << 20
"""Longest bulk read (0.75 s at 90 MB/s): a batch whose block is at its end waits for it."""


class ReadJob(NamedTuple):
    """One ranged read to submit: blocks ``first..last`` (inclusive), job id, priority."""

    first: int
    last: int
    job: int
    priority: int


class BlockRequests:
    """The read jobs of one partial shard's blocks (see the module docstring).

    ``blocks`` is the partial's block table (the partial's, shared: this component moves
    blocks to ``IN_FLIGHT`` only); ``range_blocks`` the blocks of one ``range_bytes``
    read; ``link`` the measured link that sizes bulk reads; ``bulk`` whether this process
    fetches every block of the shard (its cache fill).
    """

    def __init__(
        self,
        blocks: BlockTable,
        *,
        block_size: int,
        range_blocks: int,
        link: LinkEstimate,
        bulk: bool,
    ) -> None:
        self._blocks = blocks
        self._block_size = block_size
        self.range_blocks = range_blocks
        self._link = link
        self.bulk = bulk
        self._owner = np.full(len(blocks), -1, dtype=np.int64)  # job of in-flight blocks
        self._jobs = 0
        self._queued: dict[int, int] = {}  # jobs submitted and not started: priority

    def plan(self, blocks: I64, priority: int = DEMAND, *, bulk: bool = False) -> list[ReadJob]:
        """The jobs that fetch the missing ones of ``blocks`` (sorted, unique), their
        blocks marked in flight; with ``bulk`` (and a :attr:`bulk` shard) each run also
        takes the missing blocks after it, up to :meth:`bulk_blocks`."""
        table = self._blocks
        todo = blocks[table.missing(blocks)]
        behind = [job for job, p in self._queued.items() if p > priority]
        if priority == DEMAND and behind:
            waiting = np.asarray(behind, dtype=np.int64)
            late = table.in_flight(blocks) & np.isin(self._owner[blocks], waiting)
            if late.any():  # whole queued jobs move up: a long range stays one request
                jobs_late = np.unique(self._owner[blocks[late]])
                moved = np.flatnonzero(table.in_flight() & np.isin(self._owner, jobs_late))
                todo = np.union1d(todo, moved)
                bulk = True  # the fill's long ranges stay long
        table.request(todo)
        longest = self.bulk_blocks() if bulk and self.bulk else self.range_blocks
        runs = coalesce(todo, longest)
        if longest > self.range_blocks:
            free = table.missing()
            runs = lengthen(runs, free, longest)
            table.request(np.flatnonzero(~free))  # the blocks the runs took
        jobs = []
        for first, last in runs:
            job = self._jobs = self._jobs + 1
            self._owner[first : last + 1] = job
            self._queued[job] = priority
            jobs.append(ReadJob(first, last, job, priority))
        return jobs

    def start(self, job: ReadJob) -> list[tuple[int, int]]:
        """``job`` starts: the runs of its blocks that are still its own (blocks a batch's
        request took over are fetched by that request instead), one request as submitted."""
        self._queued.pop(job.job, None)
        first, last = job.first, job.last
        mine = np.flatnonzero(self._owner[first : last + 1] == job.job) + first
        return coalesce(mine, last - first + 1)

    def bulk_blocks(self) -> int:
        """Blocks of one bulk read: :data:`~shardstream.client.reads.link.BULK_RTTS` round
        trips of transfer at the measured link, at least ``range_bytes``, at most
        :data:`BULK_MAX_BYTES` (a batch may wait for a whole range)."""
        shortest = self.range_blocks * self._block_size
        longest = self._link.bulk_bytes(shortest, BULK_MAX_BYTES)
        return max(self.range_blocks, -(-longest // self._block_size))

    def fill_runs(self, missing: I64) -> list[tuple[int, int]]:
        """The next two reads of a whole fill over the ``missing`` blocks (the rest stay
        free for batches to request at their own, higher priority)."""
        return coalesce(missing, self.bulk_blocks() if self.bulk else self.range_blocks)[:2]
