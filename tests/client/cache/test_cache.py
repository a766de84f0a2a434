"""ShardCache in one process: keys, hits and misses, LRU order, limits, failures.

Multi-process behaviour (one download per node, pins across processes, SIGKILL) is in
``test_cache_mp.py``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardstream.client.cache.keys import key_to_name
from shardstream.client.cache.shard_cache import Fetch, ShardCache
from shardstream.errors import ConfigError, CorruptShardError


def content(key: str, size: int) -> bytes:
    return hashlib.shake_256(key.encode()).digest(size)


class Fetcher:
    """A fetch callback factory that records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, key: str, size: int) -> Fetch:
        def fetch(tmp: Path) -> None:
            self.calls.append(key)
            tmp.write_bytes(content(key, size))

        return fetch


def data_names(root: Path) -> list[str]:
    return sorted(os.listdir(root / "data"))


def test_key_to_name_is_flat_and_rejects_escapes() -> None:
    assert key_to_name("v1/shard.00001.mds") == "v1%2Fshard.00001.mds"
    assert key_to_name("a%2Fb") != key_to_name("a/b")
    assert key_to_name("~x") == "%7Ex"
    for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a/", ".", "x\x00y"]:
        with pytest.raises(ConfigError):
            key_to_name(bad)
    long_a, long_b = "v/" + "a" * 500, "v/" + "a" * 499 + "b"
    name_a, name_b = key_to_name(long_a), key_to_name(long_b)
    assert name_a != name_b and len(name_a) <= 180 and "/" not in name_a


def test_miss_then_hit_returns_the_bytes(tmp_path: Path) -> None:
    cache, fetcher = ShardCache(tmp_path), Fetcher()
    key = "ver-1/shard.00000.mds"
    with cache.lease(key, fetcher(key, 5000), size=5000) as path:
        assert path.read_bytes() == content(key, 5000)
        assert path.parent == tmp_path / "data"
    with cache.lease(key, fetcher(key, 5000), size=5000) as path:
        assert path.read_bytes() == content(key, 5000)
    assert fetcher.calls == [key]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.downloads, stats.bytes_downloaded) == (1, 1, 1, 5000)
    assert cache.contains(key) and cache.usage_bytes() == 5000
    assert os.listdir(tmp_path / "tmp") == [] and os.listdir(tmp_path / "locks") == []


def test_lru_eviction_order_and_limit(tmp_path: Path) -> None:
    cache, fetcher = ShardCache(tmp_path, limit_bytes=3000, touch_interval_s=0.0), Fetcher()
    for key in ["v/a", "v/b", "v/c"]:
        cache.prefetch(key, fetcher(key, 1000), size=1000)
    # Use "a" again: "b" is now the least recently used and goes first.
    cache.prefetch("v/a", fetcher("v/a", 1000), size=1000)
    assert cache.prefetch("v/d", fetcher("v/d", 1000), size=1000) is True
    assert data_names(tmp_path) == ["v%2Fa", "v%2Fc", "v%2Fd"]
    assert cache.usage_bytes() <= 3000
    stats = cache.stats()
    assert (stats.evictions, stats.bytes_evicted, stats.over_limit) == (1, 1000, 0)
    assert cache.prefetch("v/b", fetcher("v/b", 1000), size=1000) is True  # re-download
    assert fetcher.calls.count("v/b") == 2


def test_a_leased_shard_is_never_evicted_and_over_limit_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache, fetcher = ShardCache(tmp_path, limit_bytes=2000), Fetcher()
    # A second instance on the same root behaves like another process's view.
    other = ShardCache(tmp_path, limit_bytes=2000)
    held = [cache.acquire(k, fetcher(k, 1000), size=1000) for k in ("v/a", "v/b")]
    with caplog.at_level(logging.WARNING, logger="shardstream.client.cache.shard_cache"):
        for key in ("v/c", "v/d"):
            with other.lease(key, fetcher(key, 1000), size=1000) as path:
                assert path.read_bytes() == content(key, 1000)
    warnings = [r for r in caplog.records if "over its limit" in r.getMessage()]
    assert len(warnings) == 1 and "v/c" in warnings[0].getMessage()
    assert other.stats().over_limit == 2
    for lease in held:
        assert lease.path.read_bytes() == content(lease.key, 1000)
        lease.release()
    # Released: the next download may evict them, and the limit holds again.
    other.prefetch("v/e", fetcher("v/e", 1000), size=1000)
    assert cache.usage_bytes() <= 2000
    assert "v%2Fe" in data_names(tmp_path)


def test_shard_larger_than_the_limit_is_a_clear_error(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, limit_bytes=1000)
    with pytest.raises(ConfigError, match=r"v/big.*larger than the whole cache limit"):
        cache.prefetch("v/big", Fetcher()("v/big", 1001), size=1001)
    with pytest.raises(ConfigError):
        ShardCache(tmp_path, limit_bytes=0)


def test_failed_fetch_leaves_nothing_and_the_next_lease_retries(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, limit_bytes=10_000)

    def broken(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        (tmp.parent / "storage-temp-file").write_bytes(b"junk")
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        cache.prefetch("v/a", broken, size=1000)
    assert os.listdir(tmp_path / "tmp") == [] and data_names(tmp_path) == []
    assert os.listdir(tmp_path / "locks") == []
    assert cache.usage_bytes() == 0
    with cache.lease("v/a", Fetcher()("v/a", 1000), size=1000) as path:
        assert path.read_bytes() == content("v/a", 1000)


def test_fetch_of_the_wrong_size_is_rejected(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path)
    with pytest.raises(CorruptShardError, match=r"v/a.*wrote 999 bytes.*size=1000"):
        cache.prefetch("v/a", Fetcher()("v/a", 999), size=1000)
    with pytest.raises(CorruptShardError, match="without writing"):
        cache.prefetch("v/a", lambda tmp: None, size=1000)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-source"
    elsewhere.write_bytes(content("v/a", 1000))
    with pytest.raises(CorruptShardError, match="regular file"):
        cache.prefetch("v/a", lambda tmp: tmp.symlink_to(elsewhere), size=1000)
    assert data_names(tmp_path) == [] and os.listdir(tmp_path / "tmp") == []
    cache.prefetch("v/a", Fetcher()("v/a", 1000), size=1000)
    # A cached file of another size than the lease expects failed its check: fetched again.
    again = Fetcher()
    with cache.lease("v/a", again("v/a", 2000), size=2000) as path:
        assert path.read_bytes() == content("v/a", 2000)
    assert again.calls == ["v/a"] and cache.stats().repaired == 1


def test_fetch_may_replace_its_target_like_store_download(tmp_path: Path) -> None:
    """store.download writes a sibling temp file and os.replace()s it onto the target."""
    cache = ShardCache(tmp_path)

    def replacing(tmp: Path) -> None:
        side = tmp.with_name(tmp.name + ".part")
        side.write_bytes(content("v/a", 4096))
        os.replace(side, tmp)

    with cache.lease("v/a", replacing, size=4096) as path:
        assert path.read_bytes() == content("v/a", 4096)
    assert os.listdir(tmp_path / "tmp") == []


def test_corrupt_usage_hint_is_rescanned(tmp_path: Path) -> None:
    cache, fetcher = ShardCache(tmp_path, limit_bytes=2000), Fetcher()
    cache.prefetch("v/a", fetcher("v/a", 1000), size=1000)
    (tmp_path / "usage").write_bytes(b"\x00garbage")
    cache.prefetch("v/b", fetcher("v/b", 1000), size=1000)
    cache.prefetch("v/c", fetcher("v/c", 1000), size=1000)
    assert cache.usage_bytes() == 2000 and len(data_names(tmp_path)) == 2


def test_hot_path_does_not_scan(tmp_path: Path) -> None:
    cache, fetcher = ShardCache(tmp_path, limit_bytes=10_000), Fetcher()
    cache.prefetch("v/a", fetcher("v/a", 1000), size=1000)
    scans = cache.stats().scans
    for _ in range(200):
        cache.acquire("v/a", fetcher("v/a", 1000), size=1000).release()
    assert cache.stats().scans == scans and cache.stats().hits == 200


def test_threads_of_one_process_download_once(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, limit_bytes=100_000)
    calls: list[str] = []
    gate = threading.Event()

    def slow(tmp: Path) -> None:
        calls.append("v/a")
        gate.wait(5)
        tmp.write_bytes(content("v/a", 4000))

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(cache.prefetch, "v/a", slow, size=4000) for _ in range(4)]
        time.sleep(0.2)  # let all four reach the download lock
        gate.set()
        downloaded = [f.result() for f in futures]
    assert calls == ["v/a"] and sorted(downloaded) == [False, False, False, True]
    stats = cache.stats()
    assert (stats.misses, stats.downloads, stats.waits) == (4, 1, 3)


def test_a_full_cache_does_not_scan_on_every_miss(tmp_path: Path) -> None:
    cache, fetcher = ShardCache(tmp_path, limit_bytes=64_000), Fetcher()
    for i in range(200):
        cache.prefetch(f"v/{i}", fetcher(f"v/{i}", 1000), size=1000)
    stats = cache.stats()
    assert stats.evictions == len(fetcher.calls) - len(data_names(tmp_path)) >= 136
    # Each scan frees 1/16 of the limit beyond the need (4 more shards here).
    assert stats.scans <= 1 + (200 - 64) // 5 + 1
    assert cache.usage_bytes() <= 64_000
