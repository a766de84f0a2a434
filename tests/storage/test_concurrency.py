"""The adaptive request limit: grows while throughput grows, halves on throttling once per
round trip, honours Retry-After for every thread; and ranged reads through it."""

from __future__ import annotations

import threading
import time

import pytest

from shardstream.errors import StorageError, TransientStorageError
from shardstream.storage import LocalStore, S3Store, StorageOptions
from shardstream.storage._concurrency import AdaptiveLimit
from shardstream.storage._errors import ThrottledError, error_for_status
from tests.fixtures.clock import ManualClock as Clock
from tests.fixtures.faulty_proxy import Faults, FaultyProxy
from tests.fixtures.s3 import S3Bucket


def _succeed(limit: AdaptiveLimit, clock: Clock, n: int, *, nbytes: int, seconds: float) -> None:
    for _ in range(n):
        with limit.slot() as sent:
            clock.now += seconds
            sent(nbytes)


def test_grows_while_throughput_grows_and_holds_when_it_does_not() -> None:
    clock = Clock()
    limit = AdaptiveLimit(minimum=2, maximum=10, clock=clock)
    # Each request takes the same time whatever the concurrency: throughput per window
    # does not grow, so after the first probe the limit holds.
    _succeed(limit, clock, 40, nbytes=1000, seconds=0.01)
    held = limit.limit
    assert held <= 4
    # Now every window moves more bytes than the one before: the limit climbs.
    for k in range(1, 30):
        _succeed(limit, clock, limit.limit, nbytes=1000 * 2**k, seconds=0.01)
    assert limit.limit == 10  # capped at the maximum
    assert limit.stats.increases >= 2


def test_throttling_halves_once_per_round_trip() -> None:
    clock = Clock()
    limit = AdaptiveLimit(minimum=1, maximum=64, start=32, clock=clock)
    starts = []
    for _ in range(8):  # eight requests in flight together, all answered SlowDown
        starts.append(limit._enter())
    for started in starts:
        limit._leave(None, started, throttled=True)
    assert limit.limit == 16  # one cut for the burst, not 32 / 2**8
    assert limit.stats.throttled == 8 and limit.stats.decreases == 1
    clock.now += 1
    with pytest.raises(ThrottledError), limit.slot():
        raise ThrottledError("slow down")
    assert limit.limit == 8  # a request sent after the cut counts again


def test_retry_after_pauses_every_thread() -> None:
    limit = AdaptiveLimit(minimum=4, maximum=4)
    with pytest.raises(ThrottledError), limit.slot():
        raise ThrottledError("slow down", retry_after_s=0.3)
    entered: list[float] = []
    began = time.monotonic()

    def worker() -> None:
        with limit.slot():
            entered.append(time.monotonic() - began)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(entered) == 4 and min(entered) >= 0.25  # nobody went before the pause ended


def test_throttling_answers_map_to_throttled_error() -> None:
    err = error_for_status(503, "SlowDown", "s3://b/k", retry_after_s=2.0)
    assert isinstance(err, ThrottledError) and isinstance(err, TransientStorageError)
    assert err.retry_after_s == 2.0
    assert not isinstance(error_for_status(500, "InternalError", "k"), ThrottledError)


def test_local_read_range(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    store = LocalStore(root)
    store.write_bytes("a/b.bin", bytes(range(256)) * 4)
    assert store.read_range("a/b.bin", 10, 20) == bytes(range(10, 20))
    with pytest.raises(StorageError, match="shorter"):
        store.read_range("a/b.bin", 1000, 1100)
    from shardstream.errors import HashMismatchError

    with pytest.raises(HashMismatchError):
        store.read_range("a/b.bin", 0, 4, expected_size=5)


def test_s3_read_range_survives_cuts_and_throttling(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy
) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    S3Store(s3_bucket.name, "r").write_bytes("obj", data)
    faulty_proxy.faults = Faults(cut_rate=0.3, error_rate=0.3)
    opts = StorageOptions(
        endpoint_url=faulty_proxy.endpoint_url, retries=30, backoff_base_s=0.01, backoff_max_s=0.05
    )
    store = S3Store(s3_bucket.name, "r", opts)
    for start, end in [(0, 1), (5, 70_000), (500_000, len(data))]:
        assert store.read_range("obj", start, end, expected_size=len(data)) == data[start:end]
    assert faulty_proxy.stats["cuts"] + faulty_proxy.stats["errors"] > 0
    assert store.limit.stats.throttled > 0  # the 503s reached the adaptive limit
