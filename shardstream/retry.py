"""The one retry policy of the project: jittered exponential backoff, bounded by attempts
and/or a deadline.

Object storage (:mod:`shardstream.storage`), the metadata server's client
(:mod:`shardstream.api_client`) and the client's re-fetches of corrupt bytes all wait the
same way between attempts, so there is one value saying how (:class:`RetryPolicy`) and one
object counting one call's attempts under it (:class:`Attempts`). What counts as a
transient failure, and the error raised when the policy is spent, stay with each caller:
errors are translated at their own boundary, the waiting is shared.

Failure *n* (1, 2, ...) is followed by a wait drawn uniformly from
``[(1 - jitter) * d, d]``, where ``d = min(cap_s, base_s * 2 ** (n - 1))``: ``jitter=1``
is "full jitter" (``[0, d]``), which spreads the retries of many clients throttled at once
instead of bringing them back in lock-step; ``jitter=0.5`` keeps at least half of each wait.

>>> policy = RetryPolicy(attempts=4, base_s=0.1, cap_s=0.3, jitter=0.0)
>>> list(policy.delays())
[0.1, 0.2, 0.3]
>>> attempts = policy.start()
>>> attempts.next_delay()                 # after the first failure: wait, then try again
0.1
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from shardstream.errors import ConfigError

__all__ = ["Attempts", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying one call, and how long to wait between its attempts.

    ``attempts`` bounds the attempts in all (the first one included; ``None``: no bound but
    ``within_s``); ``within_s`` bounds the time from the first attempt after which no new
    attempt starts (``None``: no bound but ``attempts``). At least one of them is set.
    """

    attempts: int | None = 6
    """Attempts in all, the first one included (``None``: as many as ``within_s`` allows)."""
    base_s: float = 0.2
    """The wait after the first failure, before jitter; it doubles with each failure."""
    cap_s: float = 20.0
    """The longest wait between two attempts, before jitter."""
    jitter: float = 1.0
    """The share of each wait drawn at random: 1.0 waits in ``[0, d]``, 0.5 in ``[d/2, d]``,
    0 exactly ``d``."""
    within_s: float | None = None
    """Seconds after the first attempt past which no attempt starts (``None``: no deadline)."""

    def __post_init__(self) -> None:
        if self.attempts is None and self.within_s is None:
            raise ConfigError(
                "RetryPolicy needs a bound: set attempts (an int >= 1) or within_s (seconds)"
            )
        whole = isinstance(self.attempts, int) and not isinstance(self.attempts, bool)
        if self.attempts is not None and not (whole and self.attempts >= 1):
            raise ConfigError(f"RetryPolicy.attempts must be an int >= 1, got {self.attempts!r}")
        for name in ("base_s", "cap_s", "within_s"):
            value = getattr(self, name)
            if name == "within_s" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"RetryPolicy.{name} must be a number >= 0, got {value!r}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)):
            raise ConfigError(f"RetryPolicy.jitter must be a number in [0, 1], got {self.jitter!r}")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"RetryPolicy.jitter must be in [0, 1], got {self.jitter!r}")

    def nominal_s(self, failures: int) -> float:
        """The wait after failure number ``failures`` (1, 2, ...) before jitter."""
        return min(self.cap_s, self.base_s * 2.0 ** (failures - 1))

    def delay_s(
        self, failures: int, *, rng: Callable[[float, float], float] = random.uniform
    ) -> float:
        """The wait after failure number ``failures``, jittered (``rng``: ``random.uniform``)."""
        return self.nominal_s(failures) * rng(1.0 - self.jitter, 1.0)

    def delays(self) -> Iterator[float]:
        """The jittered waits between the attempts, in order (endless without ``attempts``;
        ``within_s`` is a matter of the clock, kept by :class:`Attempts`)."""
        failures = 0
        while self.attempts is None or failures < self.attempts - 1:
            failures += 1
            yield self.delay_s(failures)

    def worst_wait_s(self) -> float:
        """The longest one call can spend waiting between attempts (each attempt's own
        time aside): what a caller tells a user it will keep trying for."""
        if self.attempts is None:
            assert self.within_s is not None  # checked in __post_init__
            return float(self.within_s)
        waits = sum(self.nominal_s(n) for n in range(1, self.attempts))
        return waits if self.within_s is None else min(waits, float(self.within_s))

    def start(self, *, clock: Callable[[], float] = time.monotonic) -> Attempts:
        """The attempts of one call, starting now (its first attempt is about to be made)."""
        return Attempts(self, clock=clock)


@dataclass
class Attempts:
    """One call's attempts under a :class:`RetryPolicy`: counts failures, keeps the
    deadline, says how long to wait before the next attempt (the caller sleeps).

    >>> attempts = RetryPolicy(attempts=2, jitter=0.0).start()
    >>> attempts.next_delay(), attempts.next_delay()     # one retry, then spent
    (0.2, None)
    """

    policy: RetryPolicy
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    made: int = 1
    """Attempts made so far (the first is being made as this object is created)."""
    failures: int = 0
    """Consecutive failures counted against the policy (an attempt that made progress
    starts the count again)."""
    started: float = field(init=False)
    deadline: float | None = field(init=False)
    """The clock's reading past which no attempt starts (``None``: none)."""

    def __post_init__(self) -> None:
        self.started = self.clock()
        within = self.policy.within_s
        self.deadline = None if within is None else self.started + within

    def elapsed_s(self) -> float:
        """Seconds since the first attempt."""
        return self.clock() - self.started

    def next_delay(self, *, at_least: float = 0.0, progressed: bool = False) -> float | None:
        """Record a failed attempt; the seconds to wait before the next one, or ``None``
        when the policy is spent (out of attempts, or the wait would pass the deadline).

        ``at_least``: a wait the other side asked for (a ``Retry-After``); ``progressed``:
        the attempt got somewhere before failing (bytes of a transfer), so it counts as the
        first failure again: a transfer that keeps moving is not given up on while one
        attempt is left after it.
        """
        self.failures = 1 if progressed else self.failures + 1
        attempts = self.policy.attempts
        if attempts is not None and self.failures >= attempts:
            return None
        delay = max(self.policy.delay_s(self.failures), at_least)
        if self.deadline is not None and self.clock() + delay > self.deadline:
            return None
        self.made += 1
        return delay
