"""One process's queue of ranged reads: batch demand first, background fill after.

Every ranged read of the process goes through one :class:`RangeQueue`: a priority queue
served by a fixed set of threads, of which only as many take a job as the store's
adaptive limit lets requests through. Reads that a batch is waiting for (or will wait for in
the next few batches) run before the background reads that complete a shard for the
cache, so filling the cache never delays a batch. How many requests are actually in flight
is decided by the storage layer's adaptive limit, which every thread passes through; the
thread count is only its ceiling.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable

__all__ = ["DEMAND", "FILL", "URGENT", "RangeQueue"]

URGENT = -1
"""Priority of piece reads of a cold process's first batches (before their blocks)."""
DEMAND = 0
"""Priority of reads that batches need (soonest batch first, by submission order)."""
FILL = 1
"""Priority of background reads that complete a shard."""


class RangeQueue:
    """Runs submitted jobs on ``threads`` daemon threads, lowest ``(priority, order)`` first.

    >>> queue = RangeQueue(threads=8)
    >>> queue.submit(DEMAND, lambda: fetch_blocks(...))   # doctest: +SKIP
    """

    def __init__(self, threads: int, capacity: Callable[[], int] | None = None) -> None:
        self._capacity = capacity
        self._running = 0
        self._filling = 0
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"shardstream-range-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, priority: int, job: Callable[[], None]) -> None:
        """Queue ``job``; it must handle its own errors (they are not returned here)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("RangeQueue is closed")
            heapq.heappush(self._heap, (priority, next(self._order), job))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._full() or self._fill_capped()):
                    # The store's limit changes on its own: look again now and then.
                    self._cond.wait(timeout=0.05 if self._heap else None)
                if self._closed:
                    return
                priority, _, job = heapq.heappop(self._heap)
                self._running += 1
                self._filling += priority == FILL
            try:
                job()
            finally:
                with self._cond:
                    self._running -= 1
                    self._filling -= priority == FILL
                    self._cond.notify_all()
            # An idle thread must not keep its last job (and the partial shard, its memory
            # file and its store that the job holds) alive until the next job comes.
            del job

    def _fill_capped(self) -> bool:
        """Whether the next job is background fill and must wait: while batches' reads are
        running (the fill would take their bandwidth and CPU), or once fill holds half the
        slots (the other half stays free for the batches' reads still to come)."""
        if not self._heap or self._heap[0][0] != FILL:
            return False
        if self._running > self._filling:
            return True
        capacity = self._capacity() if self._capacity is not None else len(self._threads)
        return self._filling >= max(1, capacity // 2)

    def _full(self) -> bool:
        """Whether as many jobs run as the store lets through now: a job taken beyond that
        would wait inside the store's limit, out of priority order, while a batch's read
        queued later could not overtake it."""
        return self._capacity is not None and self._running >= max(1, self._capacity())

    def pending(self) -> int:
        """Jobs queued and not started."""
        with self._cond:
            return len(self._heap)

    def close(self) -> None:
        """Drop queued jobs and stop the threads after their current job."""
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join(timeout=30)
