"""Is training waiting for data? The loader's input figures, measured for a few ns a batch.

Per rank, the training loop's time splits into **data wait** (blocked in ``next()`` on the
loader) and **step** (between one ``next()`` returning and the next call: the model's
work). Their ratio, the *wait share*, says whether the job is input-bound; the workers'
figures say why:

* ``wait share < 10 %`` (:data:`INPUT_BOUND_SHARE`): **not input-bound**; faster input
  would speed the job up by at most that share.
* otherwise **CPU-bound** when the threads that build batches were running, or ready to
  run and waiting for a core, for at least half of their building time
  (:data:`CPU_BOUND_BUSY`: decode and transforms, or too few cores for them, are the
  limit: more workers, more cores or cheaper transforms help), else **I/O-bound** (they
  slept waiting for bytes: storage latency, throttling, a cold cache; look at requests,
  retries and the 503s). A thread's running and runqueue time come from Linux's
  ``/proc/thread-self/schedstat`` (elsewhere its CPU time alone).
* ``unknown`` until :data:`MIN_BATCHES` batches were timed.

The first batch of every pass is timed apart (``first_batch_s``): a cold start is no
steady state. What is counted, and where each counter's one home is:

* the loop's wait and step, and the batch-ready latency histogram: :class:`InputMeter`
  (main process, two clock reads a batch);
* storage requests, bytes, 503/429 throttling (``shardstream.storage``'s process limit)
  and retries (its backoff); bytes from peers (the read path's ``BlockStats``); node cache
  hits and misses (the caches' ``CacheStats``): read by :class:`ProcessCounters` in the
  process that builds batches, as differences since it started counting;
* time building batches (wall and the building thread's CPU) and ring occupancy: counted
  by that process per chunk;
* with read-time packing, the document tokens placed in rows and those truncated (fixed
  ``rows`` that do not hold a group):
  :func:`~shardstream.client.batches.packed.process_pack_counts`, read like the storage
  and cache counters.

Workers send their :class:`SourceCounters` with every chunk (a tuple of a dozen numbers);
the main process keeps each worker's latest.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardstream.client.batches.packed import process_pack_counts
from shardstream.client.cache.shard_cache import process_cache_counts
from shardstream.storage import storage_counters
from shardstream.wire import LATENCY_BUCKETS_S, Verdict, percentiles

__all__ = [
    "CPU_BOUND_BUSY",
    "INPUT_BOUND_SHARE",
    "LATENCY_BUCKETS_S",
    "MIN_BATCHES",
    "InputMeter",
    "InputStats",
    "ProcessCounters",
    "SourceCounters",
    "Verdict",
    "percentiles",
    "show_line",
    "verdict",
]

log = logging.getLogger("shardstream.client.stats")

INPUT_BOUND_SHARE = 0.10
"""Wait share at and above which a rank is input-bound."""
CPU_BOUND_BUSY = 0.5
"""Share of the building threads' time on a CPU at and above which input is CPU-bound."""
MIN_BATCHES = 8
"""Batches timed (besides each pass's first) before a verdict is given."""


def verdict(batches: int, wait_share: float, busy: float | None) -> Verdict:
    """The rule of the module docstring, from the figures it names."""
    if batches < MIN_BATCHES:
        return Verdict.UNKNOWN
    if wait_share < INPUT_BOUND_SHARE:
        return Verdict.NOT_INPUT_BOUND
    if busy is not None and busy >= CPU_BOUND_BUSY:
        return Verdict.CPU_BOUND
    return Verdict.IO_BOUND


@dataclass(frozen=True)
class SourceCounters:
    """What the processes that build batches did (sums over workers)."""

    storage_requests: int = 0
    storage_bytes: int = 0
    throttled: int = 0
    """Storage answers that asked to slow down (503 SlowDown, 429) or timed out."""
    retries: int = 0
    peer_bytes: int = 0
    """Bytes taken from another process's copy on the node instead of storage."""
    cache_hits: int = 0
    cache_misses: int = 0
    build_s: float = 0.0
    """Wall time spent building batches."""
    build_cpu_s: float = 0.0
    """Time the threads building them ran or waited for a core (decode, gather,
    transforms): the rest of ``build_s`` they slept, waiting for bytes."""
    ring_used: int = 0
    """Sum over chunks of the worker's ring slots in use when it took one."""
    ring_slots: int = 0
    """Sum over chunks of the worker's ring slots (so occupancy = used / slots)."""
    chunks: int = 0
    packed_tokens: int = 0
    """Document tokens read-time packing placed in rows."""
    truncated_tokens: int = 0
    """Document tokens read-time packing cut because no row held them (fixed ``rows``)."""

    def __add__(self, other: SourceCounters) -> SourceCounters:
        pairs = zip(self.astuple(), other.astuple(), strict=True)
        return SourceCounters(*(a + b for a, b in pairs))

    def __sub__(self, other: SourceCounters) -> SourceCounters:
        pairs = zip(self.astuple(), other.astuple(), strict=True)
        return SourceCounters(*(a - b for a, b in pairs))

    def astuple(self) -> tuple[Any, ...]:
        """The fields in order (what a worker sends; ``dataclasses.astuple`` costs 40 us)."""
        return tuple(getattr(self, name) for name in _COUNTER_FIELDS)

    @property
    def busy(self) -> float | None:
        """Share of the building time on a CPU (None before any batch was built)."""
        return min(1.0, self.build_cpu_s / self.build_s) if self.build_s > 0 else None

    @property
    def truncated_share(self) -> float | None:
        """Share of the packed documents' tokens truncated (None without packing)."""
        seen = self.packed_tokens + self.truncated_tokens
        return self.truncated_tokens / seen if seen else None

    @property
    def ring_occupancy(self) -> float | None:
        """Mean share of ring slots in use when a worker took one (None without workers)."""
        return self.ring_used / self.ring_slots if self.ring_slots else None


_COUNTER_FIELDS = tuple(f.name for f in dataclasses.fields(SourceCounters))


class ProcessCounters:
    """The counters of the process that builds batches, since this object was made.

    ``read_stats`` is the stream's :class:`~shardstream.client.reads.io.BlockStats` getter
    (the stream replaces it after a fork). Storage and cache figures are read from their
    homes on :meth:`snapshot` (a handful of attribute reads), as differences since the
    first snapshot, so what a forked worker inherited is not counted twice.
    """

    def __init__(self, read_stats: Any) -> None:
        self._read_stats = read_stats
        self._build_s = 0.0
        self._build_cpu_s = 0.0
        self._ring_used = self._ring_slots = self._chunks = 0
        self._cache_base = process_cache_counts()
        self._pack_base = process_pack_counts()
        self._base = self._storage()

    def building(self) -> _Timer:
        """Times a batch build: ``with counters.building(): ...``."""
        return _Timer(self)

    def ring(self, used: int, slots: int) -> None:
        """Record a worker's ring occupancy when it took a slot for a chunk."""
        self._ring_used += used
        self._ring_slots += slots
        self._chunks += 1

    def snapshot(self) -> SourceCounters:
        """The counters now (cumulative since this object was made)."""
        requests, nbytes, throttled, retries = (
            a - b for a, b in zip(self._storage(), self._base, strict=True)
        )
        stats = self._read_stats()
        hits, misses = (
            a - b for a, b in zip(process_cache_counts(), self._cache_base, strict=True)
        )
        placed, truncated = (
            a - b for a, b in zip(process_pack_counts(), self._pack_base, strict=True)
        )
        return SourceCounters(
            storage_requests=requests,
            storage_bytes=nbytes,
            throttled=throttled,
            retries=retries,
            peer_bytes=int(getattr(stats, "peer_bytes", 0)),
            cache_hits=hits,
            cache_misses=misses,
            build_s=self._build_s,
            build_cpu_s=self._build_cpu_s,
            ring_used=self._ring_used,
            ring_slots=self._ring_slots,
            chunks=self._chunks,
            packed_tokens=placed,
            truncated_tokens=truncated,
        )

    @staticmethod
    def _storage() -> tuple[int, int, int, int]:
        return storage_counters()


class _Timer:
    __slots__ = ("_counters", "_cpu", "_wall")

    def __init__(self, counters: ProcessCounters) -> None:
        self._counters = counters
        self._wall = self._cpu = 0.0

    def __enter__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), running_time()

    def __exit__(self, *exc: object) -> None:
        self._counters._build_s += time.perf_counter() - self._wall
        self._counters._build_cpu_s += running_time() - self._cpu


class _SchedstatFile(threading.local):
    """This thread's open ``schedstat`` (opening it costs 20 us; a read, a few)."""

    fd = -1
    pid = -1

    def get(self) -> int:
        if self.pid != os.getpid():  # after a fork the inherited one is another thread's
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            self.pid = os.getpid()
            weakref.finalize(self, os.close, self.fd)
        return self.fd


_SCHEDSTAT = _SchedstatFile()


def _schedstat_time() -> float:
    """This thread's time on a CPU plus its time runnable on a runqueue, in seconds."""
    on_cpu, waiting, _ = os.pread(_SCHEDSTAT.get(), 128, 0).split()
    return (int(on_cpu) + int(waiting)) * 1e-9


def _pick_running_time() -> Callable[[], float]:
    try:
        _schedstat_time()
    except (OSError, ValueError):
        return time.thread_time  # no schedstat: CPU time alone (a starved thread looks idle)
    return _schedstat_time


running_time = _pick_running_time()
"""Seconds this thread ran or was ready to run (runnable, waiting for a core): the time a
batch build was limited by CPU rather than by I/O."""


@dataclass(frozen=True)
class InputStats:
    """One rank's input figures (see the module docstring for the verdict's rule)."""

    batches: int
    """Batches timed (each pass's first not included)."""
    data_wait_s: float
    """Time the training loop was blocked in ``next()``."""
    step_s: float
    """Time between ``next()`` calls (the loop's own work)."""
    first_batch_s: float
    """Time the first batch of every pass took (cold starts)."""
    latency_ms: tuple[float, float, float] | None
    """Batch-ready latency p50, p95, p99 (upper bounds of the histogram's buckets)."""
    latency_counts: tuple[int, ...]
    """The histogram: batches per bucket of :data:`LATENCY_BUCKETS_S`, then the rest."""
    source: SourceCounters
    workers: int
    verdict: str

    @property
    def wait_share(self) -> float:
        """data wait / (data wait + step); 0.0 before any batch."""
        total = self.data_wait_s + self.step_s
        return self.data_wait_s / total if total > 0 else 0.0

    def line(self) -> str:
        """A one-line summary for a log."""
        s = self.source
        busy = "-" if s.busy is None else f"{s.busy:.0%}"
        lat = "-" if self.latency_ms is None else "/".join(f"{v:g}" for v in self.latency_ms)
        line = (
            f"input: {self.verdict} wait {self.wait_share:.1%} "
            f"({self.data_wait_s:.2f}s of {self.data_wait_s + self.step_s:.2f}s, "
            f"{self.batches} batches) ready p50/p95/p99 {lat} ms; build busy {busy}; "
            f"storage {s.storage_requests} req {s.storage_bytes / 2**20:.1f} MiB "
            f"retries {s.retries} throttled {s.throttled}; peers {s.peer_bytes / 2**20:.1f} "
            f"MiB; cache {s.cache_hits} hit {s.cache_misses} miss"
        )
        cut = s.truncated_share
        if cut is not None:
            seen = s.packed_tokens + s.truncated_tokens
            line += f"; packing truncated {s.truncated_tokens} of {seen} tokens ({cut:.1%})"
        return line

    def report(self, rank: int, world_size: int) -> dict[str, Any]:
        """The bounded summary sent with a checkpoint commit (a fixed set of numbers)."""
        s = self.source
        return {
            "rank": rank,
            "world_size": world_size,
            "batches": self.batches,
            "data_wait_s": round(self.data_wait_s, 6),
            "step_s": round(self.step_s, 6),
            "first_batch_s": round(self.first_batch_s, 6),
            "latency_counts": list(self.latency_counts),
            "storage_requests": s.storage_requests,
            "storage_bytes": s.storage_bytes,
            "throttled": s.throttled,
            "retries": s.retries,
            "peer_bytes": s.peer_bytes,
            "cache_hits": s.cache_hits,
            "cache_misses": s.cache_misses,
            "packed_tokens": s.packed_tokens,
            "truncated_tokens": s.truncated_tokens,
            "build_s": round(s.build_s, 6),
            "build_cpu_s": round(s.build_cpu_s, 6),
            "ring_occupancy": None if s.ring_occupancy is None else round(s.ring_occupancy, 4),
            "workers": self.workers,
            "verdict": self.verdict,
        }


def show_line(line: str) -> None:
    """Show a stats line the user asked for (``log_stats_every``): logged at INFO on
    ``shardstream.client.stats`` where logging is set up to show it, else written to
    stderr, so it is seen without configuring logging (Python's default shows WARNING
    only, and the line is no warning)."""
    if log.hasHandlers() and log.isEnabledFor(logging.INFO):
        log.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


@dataclass
class _Window:
    batches: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    first_s: float = 0.0
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))


class InputMeter:
    """The training loop's side: times each ``next()`` and holds the workers' counters.

    ``timed(batches)`` wraps the iterator the loop consumes. ``local`` is the counters of
    this process when it builds the batches itself (no workers).
    """

    def __init__(self, local: ProcessCounters | None, *, log_every: int | None = None) -> None:
        self.local = local
        self.log_every = log_every
        self._total = _Window()
        self._since_report = _Window()
        self._workers: dict[int, SourceCounters] = {}
        self._retired = SourceCounters()  # counters of workers that were replaced
        self._reported = SourceCounters()
        self.num_workers = 0

    def worker(self, index: int, counters: Sequence[Any]) -> None:
        """Record worker ``index``'s latest cumulative counters."""
        self._workers[index] = SourceCounters(*counters)

    def workers_stopped(self) -> None:
        """The workers exit: keep what they counted."""
        for counters in self._workers.values():
            self._retired = self._retired + counters
        self._workers.clear()

    def timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Yield ``batches``, timing the wait for each and the step after it."""
        clock, cpu_clock = time.perf_counter, running_time
        windows = (self._total, self._since_report)
        local = self.local  # without workers, this thread builds the batches in next()
        asked = clock()
        cpu = cpu_clock() if local is not None else 0.0
        first = True
        returned = asked
        for batch in batches:
            got = clock()
            wait = got - asked
            if local is not None:
                local._build_s += wait
                local._build_cpu_s += cpu_clock() - cpu
            if first:
                for w in windows:
                    w.first_s += wait
                first = False
            else:
                step = asked - returned
                bucket = bisect.bisect_left(LATENCY_BUCKETS_S, wait)
                for w in windows:
                    w.batches += 1
                    w.wait_s += wait
                    w.step_s += step
                    w.counts[bucket] += 1
                if self.log_every and self._total.batches % self.log_every == 0:
                    show_line(self.stats().line())
            returned = clock()
            yield batch
            asked = clock()
            if local is not None:
                cpu = cpu_clock()

    def source(self) -> SourceCounters:
        """The batch builders' counters so far (workers, or this process)."""
        total = self._retired
        for counters in self._workers.values():
            total = total + counters
        if self.local is not None:
            total = total + self.local.snapshot()
        return total

    def stats(self) -> InputStats:
        """Everything since the loader was made."""
        return self._stats(self._total, self.source())

    def report_window(self) -> InputStats:
        """The figures since the previous call (what a checkpoint commit carries)."""
        # Reset in place: a running ``timed`` generator holds this window.
        live = self._since_report
        window = dataclasses.replace(live, counts=list(live.counts))
        live.batches, live.wait_s, live.step_s, live.first_s = 0, 0.0, 0.0, 0.0
        live.counts[:] = [0] * len(live.counts)
        source = self.source()
        delta, self._reported = source - self._reported, source
        return self._stats(window, delta)

    def _stats(self, w: _Window, source: SourceCounters) -> InputStats:
        total = w.wait_s + w.step_s
        share = w.wait_s / total if total > 0 else 0.0
        pct = percentiles(w.counts) or None
        return InputStats(
            batches=w.batches,
            data_wait_s=w.wait_s,
            step_s=w.step_s,
            first_batch_s=w.first_s,
            latency_ms=None if pct is None else (pct[0], pct[1], pct[2]),
            latency_counts=tuple(w.counts),
            source=source,
            workers=self.num_workers,
            verdict=verdict(w.batches, share, source.busy),
        )
