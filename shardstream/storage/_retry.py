"""Retrying transient failures with jittered exponential backoff ("full jitter")."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardstream.errors import TransientStorageError

from ._options import StorageOptions

T = TypeVar("T")
log = logging.getLogger("shardstream.storage")

_retries = [0]  # this process's retries (a list: one mutable cell, read without a lock)


def retries_so_far() -> int:
    """Storage requests this process retried after a transient failure (with a fork's
    inheritance: callers count differences)."""
    return _retries[0]


@dataclass
class Backoff:
    """Attempt counting and sleeping for one request (or one part of a transfer).

    Full jitter (sleep uniformly in ``[0, min(cap, base * 2**n)]``) spreads the retries of
    many clients hit by the same throttling, instead of having them return in lock-step.
    """

    options: StorageOptions
    what: str
    failures: int = 0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def failed(self, exc: TransientStorageError, *, progressed: bool = False) -> None:
        """Record a failed attempt: sleep before the next one, or re-raise when out of attempts.

        ``progressed`` means the attempt got some bytes before failing; a transfer that keeps
        moving is never given up on, so such an attempt does not count against the limit.
        """
        self.failures = 1 if progressed else self.failures + 1
        if self.failures >= self.options.retries:
            raise TransientStorageError(
                f"{exc} (gave up after {self.failures} attempts; raise "
                "StorageOptions.retries if the store is slow to recover)"
            ) from exc
        cap = min(
            self.options.backoff_max_s, self.options.backoff_base_s * 2 ** (self.failures - 1)
        )
        delay = random.uniform(0, cap)
        _retries[0] += 1  # a lost increment between threads costs one count, never a lock
        log.debug("%s: %s; retrying in %.2fs", self.what, exc, delay)
        self.sleep(delay)


def retrying(options: StorageOptions, what: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` until it returns, retrying :class:`TransientStorageError` with backoff."""
    backoff = Backoff(options, what)
    while True:
        try:
            return fn()
        except TransientStorageError as exc:
            backoff.failed(exc)
