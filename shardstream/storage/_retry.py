"""Storage's side of the retry policy: a transient store failure waits under
:class:`~shardstream.retry.RetryPolicy` (full jitter, from :class:`StorageOptions`), and
one that outlasts it is raised as :class:`TransientStorageError` naming the setting."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardstream.errors import TransientStorageError
from shardstream.retry import Attempts, RetryPolicy

from ._options import StorageOptions

T = TypeVar("T")
log = logging.getLogger("shardstream.storage")

_retries = [0]  # this process's retries (a list: one mutable cell, read without a lock)


def retries_so_far() -> int:
    """Storage requests this process retried after a transient failure (with a fork's
    inheritance: callers count differences)."""
    return _retries[0]


def storage_policy(options: StorageOptions) -> RetryPolicy:
    """The retry policy ``options`` describe: ``retries`` attempts in all, full jitter
    (many clients throttled at once come back spread out, not in lock-step)."""
    return RetryPolicy(
        attempts=options.retries,
        base_s=options.backoff_base_s,
        cap_s=options.backoff_max_s,
        jitter=1.0,
    )


@dataclass
class Backoff:
    """Attempt counting and sleeping for one request (or one part of a transfer)."""

    options: StorageOptions
    what: str
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    attempts: Attempts = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.attempts = storage_policy(self.options).start()

    @property
    def failures(self) -> int:
        """Failures counted against ``StorageOptions.retries`` so far."""
        return self.attempts.failures

    def failed(self, exc: TransientStorageError, *, progressed: bool = False) -> None:
        """Record a failed attempt: sleep before the next one, or re-raise when out of attempts.

        ``progressed`` means the attempt got some bytes before failing; a transfer that keeps
        moving is never given up on, so such an attempt does not count against the limit.
        """
        delay = self.attempts.next_delay(progressed=progressed)
        if delay is None:
            raise TransientStorageError(
                f"{exc} (gave up after {self.failures} attempts; raise "
                "StorageOptions.retries if the store is slow to recover)"
            ) from exc
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
