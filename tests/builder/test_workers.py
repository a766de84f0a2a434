"""ordered_map: results in input order whatever the workers do; a dead worker is reported."""

from __future__ import annotations

import os
import signal
import time

import pytest

from shardstream.errors import ShardstreamError
from shardstream.shard_builder.workers import ordered_map


def _slow_square(x: int) -> int:
    time.sleep(0.02 * (x % 3))  # later items often finish first
    return x * x


def _die_on_five(x: int) -> int:
    if x == 5:
        os._exit(3)  # as if the OOM killer took the worker
    return x


def _bus_error_on_five(x: int) -> int:
    if x == 5:
        os.kill(os.getpid(), signal.SIGBUS)  # as a read past the end of a mapped file does
    return x


def _fail_on_four(x: int) -> int:
    if x == 4:
        raise ValueError("item 4 is bad")
    return x


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_come_back_in_input_order(workers: int) -> None:
    assert list(ordered_map(_slow_square, range(12), workers=workers)) == [x * x for x in range(12)]


def test_a_dead_worker_is_one_clear_error() -> None:
    with pytest.raises(ShardstreamError, match=r"worker process died.*resume"):
        list(ordered_map(_die_on_five, range(10), workers=2))


def test_a_worker_killed_by_sigbus_is_named_so() -> None:
    # A damaged LMDB database read through its memory map ends its reader with SIGBUS:
    # "out of memory: try fewer --workers" sent the user the wrong way.
    with pytest.raises(ShardstreamError, match=r"worker process died \(SIGBUS: .*damaged"):
        list(ordered_map(_bus_error_on_five, range(10), workers=2))


def test_an_exception_in_a_worker_reaches_the_caller() -> None:
    seen = []
    with pytest.raises(ValueError, match="item 4 is bad"):
        for value in ordered_map(_fail_on_four, range(10), workers=2):
            seen.append(value)
    assert seen == [0, 1, 2, 3]
