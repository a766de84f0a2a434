"""The link to the store as one process sees it: round trip and bandwidth per request.

A ranged GET costs a round trip (S3: ~20-30 ms to first byte) plus its bytes at one
connection's bandwidth (~85-90 MB/s). A range that takes one round trip to transfer
spends half its time waiting; one that takes ``k`` round trips wastes ``1 / (k + 1)``. So
the bulk of a shard (everything after a cold first batch) is read in ranges of several
round trips' worth of bytes, the bandwidth-delay product times :data:`BULK_RTTS`, and
short reads (headers, pieces) stay short because a batch waits for them.

:class:`LinkEstimate` learns both figures from the process's own reads: a short read (at
most :data:`SHORT_BYTES`) takes about one round trip, and a long one's time beyond the
round trip is its bytes at the connection's bandwidth. Until it has seen any, it assumes
S3's figures. It is an estimate for sizing requests, never a promise: its ranges are
clamped to ``[floor, ceiling]``.
"""

from __future__ import annotations

import threading

__all__ = ["BULK_RTTS", "SHORT_BYTES", "LinkEstimate"]

BULK_RTTS = 8
"""Round trips a bulk range should take to transfer (its first byte's wait then costs at
most 1/9 of its time)."""

SHORT_BYTES = 256 << 10
"""Reads up to this size take about one round trip (their transfer is a few ms at most)."""

_WEIGHT = 0.2  # of a new observation in the moving averages


class LinkEstimate:
    """Moving averages of the round trip and one connection's bandwidth (thread-safe).

    >>> link = LinkEstimate()
    >>> link.observe(64 << 10, 0.02)          # a piece: about one round trip
    >>> link.observe(8 << 20, 0.02 + 0.0932)  # 8 MiB at 90 MB/s after it
    >>> round(link.bulk_bytes(8 << 20, 64 << 20) / 1e6, 1)
    14.4
    """

    def __init__(self, rtt_s: float = 0.025, bytes_per_s: float = 90e6) -> None:
        self.rtt_s = rtt_s
        self.bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._short_seen = False
        self._long_seen = False

    def observe(self, nbytes: int, seconds: float) -> None:
        """One request of ``nbytes`` took ``seconds`` from sending it to its last byte."""
        if seconds <= 0:
            return
        with self._lock:
            if nbytes <= SHORT_BYTES:
                self.rtt_s = _mix(self.rtt_s, seconds, self._short_seen)
                self._short_seen = True
            else:
                moving = max(seconds - self.rtt_s, seconds / 4)  # never a zero-time body
                self.bytes_per_s = _mix(self.bytes_per_s, nbytes / moving, self._long_seen)
                self._long_seen = True

    def bulk_bytes(self, floor: int, ceiling: int) -> int:
        """Bytes of a bulk range: :data:`BULK_RTTS` round trips of transfer, within
        ``[floor, ceiling]``."""
        with self._lock:
            wanted = BULK_RTTS * self.rtt_s * self.bytes_per_s
        return int(min(max(wanted, floor), max(floor, ceiling)))


def _mix(old: float, new: float, seen: bool) -> float:
    """The moving average after ``new`` (the first observation replaces the assumption)."""
    return new if not seen else (1 - _WEIGHT) * old + _WEIGHT * new
