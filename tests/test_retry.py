"""The one retry policy (shardstream.retry): waits grow, are capped and jittered within
their bounds; attempts and the deadline are honoured; bad settings are named."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardstream.errors import ConfigError
from shardstream.retry import RetryPolicy
from tests.fixtures.clock import ManualClock


def test_waits_double_up_to_the_cap() -> None:
    policy = RetryPolicy(attempts=7, base_s=0.5, cap_s=3.0, jitter=0.0)
    assert list(policy.delays()) == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert policy.worst_wait_s() == 12.5


@given(
    failures=st.integers(1, 40),
    base=st.floats(0.0, 10.0),
    cap=st.floats(0.0, 60.0),
    jitter=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_each_wait_lies_within_its_jitter(
    failures: int, base: float, cap: float, jitter: float, seed: int
) -> None:
    policy = RetryPolicy(attempts=50, base_s=base, cap_s=cap, jitter=jitter)
    nominal = min(cap, base * 2.0 ** (failures - 1))
    assert policy.nominal_s(failures) == nominal
    wait = policy.delay_s(failures, rng=random.Random(seed).uniform)
    assert (1 - jitter) * nominal - 1e-9 <= wait <= nominal + 1e-9
    # the rng's extremes are the bounds themselves
    assert policy.delay_s(failures, rng=lambda low, high: low) == pytest.approx(
        (1 - jitter) * nominal
    )
    assert policy.delay_s(failures, rng=lambda low, high: high) == pytest.approx(nominal)


def test_full_jitter_spreads_the_waits() -> None:
    """Many clients failing at once do not come back together."""
    policy = RetryPolicy(attempts=3, base_s=1.0, cap_s=1.0, jitter=1.0)
    waits = [policy.delay_s(1) for _ in range(200)]
    assert all(0.0 <= w <= 1.0 for w in waits)
    assert len(set(waits)) > 150 and min(waits) < 0.25 and max(waits) > 0.75


def test_attempts_bound_the_retries() -> None:
    attempts = RetryPolicy(attempts=3, base_s=0.1, jitter=0.0).start()
    assert attempts.next_delay() == 0.1
    assert attempts.next_delay() == 0.2
    assert attempts.next_delay() is None
    assert attempts.made == 3
    assert RetryPolicy(attempts=1).start().next_delay() is None  # no retry at all


def test_the_deadline_is_honoured() -> None:
    """No wait is handed out that would end past the deadline, however many attempts the
    policy would otherwise allow."""
    clock = ManualClock(100.0)
    policy = RetryPolicy(attempts=None, base_s=1.0, cap_s=4.0, jitter=0.0, within_s=10.0)
    attempts = policy.start(clock=clock)
    assert attempts.deadline == 110.0
    waits = []
    while (wait := attempts.next_delay()) is not None:
        waits.append(wait)
        clock.now += wait + 0.5  # the attempt itself takes time too
    assert waits == [1.0, 2.0, 4.0]  # a 4 s wait at 108.0 would end past 110
    assert clock.now + 4.0 > attempts.deadline
    assert attempts.made == 4 and attempts.elapsed_s() == pytest.approx(8.5)
    assert policy.worst_wait_s() == 10.0


def test_both_bounds_together_stop_at_the_first_reached() -> None:
    clock = ManualClock(100.0)
    attempts = RetryPolicy(attempts=3, base_s=0.0, within_s=60.0).start(clock=clock)
    assert [attempts.next_delay() for _ in range(3)] == [0.0, 0.0, None]
    assert RetryPolicy(attempts=5, base_s=1.0, cap_s=1.0, within_s=2.5).worst_wait_s() == 2.5


def test_a_requested_wait_is_kept_and_still_bounded_by_the_deadline() -> None:
    """A Retry-After longer than the backoff is waited out, unless it passes the deadline."""
    clock = ManualClock(100.0)
    attempts = RetryPolicy(attempts=None, base_s=0.1, jitter=0.0, within_s=5.0).start(clock=clock)
    assert attempts.next_delay(at_least=3.0) == 3.0
    clock.now += 3.0
    assert attempts.next_delay(at_least=3.0) is None


def test_progress_starts_the_count_again() -> None:
    """A transfer that keeps moving is not given up on (storage's resumed downloads)."""
    attempts = RetryPolicy(attempts=2, base_s=0.1, jitter=0.0).start()
    for _ in range(10):
        assert attempts.next_delay(progressed=True) == 0.1
    assert attempts.next_delay() is None


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"attempts": None}, "needs a bound"),
        ({"attempts": 0}, "attempts must be an int >= 1, got 0"),
        ({"attempts": True}, "attempts must be an int >= 1"),
        ({"attempts": 2.5}, "attempts must be an int >= 1"),
        ({"base_s": -1}, "base_s must be a number >= 0"),
        ({"cap_s": float("nan")}, "cap_s must be a number >= 0"),
        ({"within_s": -0.5}, "within_s must be a number >= 0"),
        ({"jitter": 1.5}, "jitter must be in [0, 1], got 1.5"),
        ({"jitter": "full"}, "jitter must be a number"),
    ],
)
def test_bad_settings_are_named(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=f"RetryPolicy.*{re.escape(named)}"):
        RetryPolicy(**settings)  # type: ignore[arg-type]
