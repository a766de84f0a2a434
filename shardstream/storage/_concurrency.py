"""Adaptive request concurrency: one limit per process, grown while it pays, cut on throttling.

Object stores reward parallel ranged reads (one connection carries ~90 MB/s on S3) but
punish too many (``503 SlowDown`` above ~5,500 GET/s per key prefix). A fixed number of
connections is wrong on both sides, so every request of the process passes through one
:class:`AdaptiveLimit`, an AIMD controller in the spirit of TCP congestion avoidance:

* **additive increase**: after a full window of successful requests (``limit`` of them),
  the limit grows by one (doubles, until the first throttling answer: a cold start reaches
  a busy link's concurrency in a few round trips), but only while the measured throughput
  of the last window grew too (by 5 %): more connections that add no bytes per second only
  add load;
* **multiplicative decrease**: a throttling answer (503/SlowDown, 429, a timeout) halves
  the limit, at most once per window, so a burst of answers to requests that were already
  in flight counts as one signal, not as a collapse to the minimum;
* **Retry-After**: when the store names a pause, no new request starts before it ends,
  for every thread of the process: the retries of many threads do not become a storm.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ._errors import ThrottledError

__all__ = ["AdaptiveLimit", "LimitStats"]

_GROWTH = 1.05
"""A window must beat the previous one's throughput by this factor for the limit to grow."""
_REPROBE = 16
"""Windows held without growth before the limit is probed one higher anyway."""


@dataclass
class LimitStats:
    """What the limiter saw in this process (counters since it was built)."""

    requests: int = 0
    bytes: int = 0
    """Bytes received by the requests that succeeded."""
    throttled: int = 0
    """Requests answered with throttling (503/SlowDown, 429) or timed out."""
    decreases: int = 0
    increases: int = 0
    peak_in_flight: int = 0
    limit: int = 0
    """The limit in force now."""


class AdaptiveLimit:
    """A counting semaphore whose size adapts between ``minimum`` and ``maximum``.

    >>> limit = AdaptiveLimit(minimum=2, maximum=64, start=4)
    >>> with limit.slot() as done:      # doctest: +SKIP
    ...     data = get_range(...)
    ...     done(len(data))            # report the bytes, to measure throughput
    """

    def __init__(
        self,
        *,
        minimum: int,
        maximum: int,
        start: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"AdaptiveLimit needs 1 <= minimum <= maximum: {minimum}, {maximum}")
        self.minimum, self.maximum = minimum, maximum
        self._clock = clock
        self._cond = threading.Condition()
        self._limit = max(minimum, min(maximum, start if start is not None else minimum))
        self._in_flight = 0
        self._paused_until = 0.0
        self._window_done = 0
        self._window_bytes = 0
        self._window_start = clock()
        self._last_rate = 0.0
        self._holds = 0
        self._last_cut = float("-inf")
        self.stats = LimitStats(limit=self._limit)

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""
        return self._limit

    @contextmanager
    def slot(self) -> Iterator[Callable[[int], None]]:
        """Hold one request slot for the ``with`` block (waits for a free slot and for any
        Retry-After pause). The block reports its bytes through the callable it is given.
        Leaving it with :class:`ThrottledError` is a throttling signal; other errors are
        neutral (a cut connection says nothing about the load the store accepts)."""
        started = self._enter()
        sent = [0]
        try:
            yield lambda n: sent.__setitem__(0, sent[0] + n)
        except ThrottledError as exc:
            self._leave(None, started, throttled=True, retry_after_s=exc.retry_after_s)
            raise
        except BaseException:
            self._leave(None, started)
            raise
        self._leave(sent[0], started)

    def _enter(self) -> float:
        with self._cond:
            while True:
                wait = self._paused_until - self._clock()
                if wait <= 0 and self._in_flight < self._limit:
                    break
                self._cond.wait(timeout=wait if wait > 0 else None)
            self._in_flight += 1
            self.stats.requests += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, self._in_flight)
            return self._clock()

    def _leave(
        self,
        nbytes: int | None,
        started: float,
        *,
        throttled: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        with self._cond:
            self._in_flight -= 1
            if throttled:
                self._throttled(started, retry_after_s)
            elif nbytes is not None:
                self.stats.bytes += nbytes
                self._succeeded(nbytes)
            self._cond.notify_all()

    def _succeeded(self, nbytes: int) -> None:
        self._window_done += 1
        self._window_bytes += nbytes
        if self._window_done < self._limit:
            return
        now = self._clock()
        rate = self._window_bytes / max(now - self._window_start, 1e-6)
        # Grow while more connections bring more bytes per second (or nothing is known
        # yet); hold otherwise, and re-probe after a while in case the link got faster.
        probing = (
            self._last_rate == 0.0 or rate >= self._last_rate * _GROWTH or self._holds >= _REPROBE
        )
        if probing and self._limit < self.maximum:
            # Slow start, as TCP: double until the store first pushes back, then +1.
            grow = self._limit if self._last_cut == float("-inf") else 1
            self._limit = min(self.maximum, self._limit + grow)
            self.stats.increases += 1
        if probing:
            self._last_rate, self._holds = rate, 0
        else:
            self._holds += 1
        self._window_done, self._window_bytes, self._window_start = 0, 0, now
        self.stats.limit = self._limit

    def _throttled(self, started: float, retry_after_s: float | None) -> None:
        now = self._clock()
        self.stats.throttled += 1
        if retry_after_s is not None and retry_after_s > 0:
            self._paused_until = max(self._paused_until, now + min(retry_after_s, 60.0))
        # Once per round trip, as TCP does: answers to requests sent before the last cut
        # describe the old load, not the new one.
        if started > self._last_cut:
            self._limit = max(self.minimum, self._limit // 2)
            self._last_cut = now
            self.stats.decreases += 1
            self._window_done, self._window_bytes, self._window_start = 0, 0, now
            self._last_rate = 0.0
        self.stats.limit = self._limit
