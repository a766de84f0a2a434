"""ShardCache across real processes: one download per node, pins, SIGKILL recovery.

Every child is a real process (multiprocessing ``spawn`` and ``fork``). Downloads are
counted through the file system: the fetch callback appends one line per call to a log
opened with O_APPEND, which concurrent processes can share without losing lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shardstream.client.cache.shard_cache import Fetch, ShardCache

pytestmark = pytest.mark.slow

JOIN_S = 60


def content(key: str, size: int) -> bytes:
    return hashlib.shake_256(key.encode()).digest(size)


def logging_fetch(key: str, size: int, log: Path, pause_s: float = 0.0) -> Fetch:
    """Writes the shard in two halves (with an optional pause) and logs the call."""

    def fetch(tmp: Path) -> None:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{key} {os.getpid()}\n".encode())
        finally:
            os.close(fd)
        data = content(key, size)
        with open(tmp, "wb") as f:
            f.write(data[: size // 2])
            f.flush()
            if pause_s:
                time.sleep(pause_s)
            f.write(data[size // 2 :])

    return fetch


def data_bytes(root: Path) -> int:
    total = 0
    with os.scandir(root / "data") as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
                total += entry.stat().st_size
    return total


def download_counts(log: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in log.read_text().splitlines())


def wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


# --- child process entry points (top level: spawn pickles them by name) ------------------


def hammer(
    cache: ShardCache | None,
    root: str,
    limit: int | None,
    shards: dict[str, int],
    seed: int,
    rounds: int,
    out: str,
) -> None:
    """Lease every shard ``rounds`` times in random order; check bytes; record stats."""
    if cache is None:
        cache = ShardCache(root, limit_bytes=limit)
    rng = random.Random(seed)
    log = Path(root).parent / "downloads.log"
    max_seen = 0
    bad: list[str] = []
    for _ in range(rounds):
        keys = list(shards)
        rng.shuffle(keys)
        for key in keys:
            size = shards[key]
            if rng.random() < 0.3:
                cache.prefetch(key, logging_fetch(key, size, log, 0.002), size=size)
            with cache.lease(key, logging_fetch(key, size, log, 0.002), size=size) as path:
                max_seen = max(max_seen, data_bytes(Path(root)))
                if path.read_bytes() != content(key, size):
                    bad.append(key)
                time.sleep(rng.random() * 0.002)
    stats = cache.stats()
    Path(out).write_text(json.dumps({"stats": vars(stats), "max_seen": max_seen, "bad": bad}))


def hold_lease(root: str, key: str, size: int, ready: str, go: str, out: str) -> None:
    """Lease ``key``, say so, wait for ``go``, then check the bytes are still intact."""
    cache = ShardCache(root)
    log = Path(root).parent / "downloads.log"
    with cache.lease(key, logging_fetch(key, size, log), size=size) as path:
        Path(ready).touch()
        wait_for(Path(go))
        Path(out).write_text(json.dumps({"intact": path.read_bytes() == content(key, size)}))


def hang_in_fetch(root: str, key: str, size: int, started: str) -> None:
    """A download that writes half the shard and then hangs until it is killed."""
    cache = ShardCache(root)

    def fetch(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(content(key, size)[: size // 2])
        Path(started).touch()
        time.sleep(600)

    cache.prefetch(key, fetch, size=size)


def lease_and_time(root: str, key: str, size: int, waiting: str, out: str) -> None:
    """Lease ``key`` (maybe blocked behind another downloader) and time it."""
    cache = ShardCache(root)
    log = Path(root).parent / "downloads.log"
    Path(waiting).touch()
    t0 = time.monotonic()
    with cache.lease(key, logging_fetch(key, size, log), size=size) as path:
        ok = path.read_bytes() == content(key, size)
    result = {"ok": ok, "seconds": time.monotonic() - t0, "stats": vars(cache.stats())}
    Path(out).write_text(json.dumps(result))


def hold_lease_forever(root: str, key: str, size: int, ready: str) -> None:
    cache = ShardCache(root)
    with cache.lease(key, logging_fetch(key, size, Path(root).parent / "downloads.log"), size=size):
        Path(ready).touch()
        time.sleep(600)


def lease_forever(root: str, limit: int, shards: dict[str, int], seed: int, out: str) -> None:
    """Lease random shards until killed; exit non-zero on wrong bytes or an overshoot."""
    cache = ShardCache(root, limit_bytes=limit)
    rng = random.Random(seed)
    log = Path(root).parent / "downloads.log"
    while True:
        key = rng.choice(list(shards))
        size = shards[key]
        fetch = logging_fetch(key, size, log, rng.random() * 0.01)
        with cache.lease(key, fetch, size=size) as path:
            if path.read_bytes() != content(key, size):
                Path(out).write_text(f"wrong bytes in {key}")
                os._exit(3)
            seen = data_bytes(Path(root))
            if seen > limit:
                Path(out).write_text(f"{seen} bytes cached, over the limit {limit}")
                os._exit(4)


def report_stats(cache: ShardCache, key: str, out: str) -> None:
    """In a forked child: counters start at zero, the inherited cache still works."""
    before = vars(cache.stats())
    with cache.lease(key, logging_fetch(key, 1000, Path(out + ".log")), size=1000) as path:
        ok = path.read_bytes() == content(key, 1000)
    Path(out).write_text(json.dumps({"before": before, "after": vars(cache.stats()), "ok": ok}))


# --- tests ------------------------------------------------------------------------------


def run_hammer(tmp_path: Path, method: str, limit: int | None, rounds: int) -> list[dict[str, Any]]:
    ctx: Any = mp.get_context(method)
    rng = random.Random(7)
    shards = {f"ver-{i % 3}/shard.{i:05d}.mds": rng.randint(20_000, 60_000) for i in range(16)}
    root = tmp_path / "cache"
    # With fork the children inherit one ShardCache built here (the DataLoader pattern).
    shared = ShardCache(root, limit_bytes=limit) if method == "fork" else None
    procs, outs = [], []
    for seed in range(4):
        out = tmp_path / f"out{seed}.json"
        args = (shared, str(root), limit, shards, seed, rounds, str(out))
        procs.append(ctx.Process(target=hammer, args=args))
        outs.append(out)
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_S)
        assert p.exitcode == 0, f"hammer child exited with {p.exitcode}"
    results = [json.loads(o.read_text()) for o in outs]
    for r in results:
        assert r["bad"] == [], f"wrong bytes read for {r['bad']}"
    assert os.listdir(root / "tmp") == [] and os.listdir(root / "locks") == []
    if limit is not None:
        # Every process holds one lease at a time and the limit fits 4 of the largest
        # shards, so the limit is never crossed, not even transiently.
        assert max(r["max_seen"] for r in results) <= limit
        assert sum(r["stats"]["over_limit"] for r in results) == 0
        assert ShardCache(root, limit_bytes=limit).usage_bytes() <= limit
    return results


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_ample_limit_downloads_each_shard_once_per_node(tmp_path: Path, method: str) -> None:
    results = run_hammer(tmp_path, method, limit=None, rounds=2)
    counts = download_counts(tmp_path / "downloads.log")
    assert len(counts) == 16 and set(counts.values()) == {1}, counts
    assert sum(r["stats"]["downloads"] for r in results) == 16
    assert sum(r["stats"]["evictions"] for r in results) == 0
    # Each process leased each shard twice; misses it did not download, it waited for.
    for r in results:
        s = r["stats"]
        assert s["misses"] == s["downloads"] + s["waits"]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_tight_limit_evicts_but_never_overshoots(tmp_path: Path, method: str) -> None:
    limit = 4 * 60_000 + 10_000  # about 6 of the 16 shards fit
    results = run_hammer(tmp_path, method, limit=limit, rounds=3)
    assert sum(r["stats"]["evictions"] for r in results) > 0
    counts = download_counts(tmp_path / "downloads.log")
    assert set(counts) == {k for k in counts} and len(counts) == 16
    assert sum(counts.values()) == sum(r["stats"]["downloads"] for r in results)


def test_lease_in_one_process_blocks_eviction_by_another(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    root = tmp_path / "cache"
    ready, go, out = tmp_path / "ready", tmp_path / "go", tmp_path / "out.json"
    child = ctx.Process(
        target=hold_lease, args=(str(root), "v/x", 1000, str(ready), str(go), str(out))
    )
    child.start()
    try:
        wait_for(ready)
        cache = ShardCache(root, limit_bytes=2000)
        log = tmp_path / "downloads.log"
        for key in ("v/a", "v/b", "v/c"):  # each needs an eviction; "v/x" is the oldest
            with cache.lease(key, logging_fetch(key, 1000, log), size=1000):
                pass
        assert (root / "data" / "v%2Fx").exists()
        assert cache.stats().evictions == 2 and cache.stats().over_limit == 0
    finally:
        go.touch()
        child.join(JOIN_S)
    assert child.exitcode == 0 and json.loads(out.read_text()) == {"intact": True}
    # Unpinned now: the next download evicts it first (least recently used).
    cache.prefetch("v/d", logging_fetch("v/d", 1000, log), size=1000)
    assert not (root / "data" / "v%2Fx").exists()
    assert cache.usage_bytes() <= 2000


def test_sigkilled_downloader_blocks_nobody(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    root = tmp_path / "cache"
    ShardCache(root)
    key, size = "v/shard.00000.mds", 200_000
    started = tmp_path / "started"
    doomed = ctx.Process(target=hang_in_fetch, args=(str(root), key, size, str(started)))
    doomed.start()
    wait_for(started)
    assert len(os.listdir(root / "tmp")) == 1  # the half-written download
    # A second process asks for the same shard and blocks on the download lock.
    waiting, out = tmp_path / "waiting", tmp_path / "out.json"
    reader = ctx.Process(target=lease_and_time, args=(str(root), key, size, str(waiting), str(out)))
    reader.start()
    wait_for(waiting)
    time.sleep(0.5)
    assert not out.exists(), "the reader should be waiting for the first download"
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(JOIN_S)
    assert doomed.exitcode == -signal.SIGKILL
    reader.join(JOIN_S)
    assert reader.exitcode == 0
    result = json.loads(out.read_text())
    assert result["ok"] and result["stats"]["downloads"] == 1
    assert result["seconds"] < 10, result  # blocked ~0.5 s, then its own quick download
    assert os.listdir(root / "tmp") == [] and os.listdir(root / "locks") == []
    assert (root / "data" / "v%2Fshard.00000.mds").read_bytes() == content(key, size)


def test_leftovers_of_a_killed_download_are_swept_at_start(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    root = tmp_path / "cache"
    started = tmp_path / "started"
    doomed = ctx.Process(target=hang_in_fetch, args=(str(root), "v/y", 100_000, str(started)))
    doomed.start()
    wait_for(started)
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.join(JOIN_S)
    assert os.listdir(root / "tmp") and os.listdir(root / "locks")  # left behind
    cache = ShardCache(root, limit_bytes=150_000)  # a new run starts
    assert os.listdir(root / "tmp") == [] and os.listdir(root / "locks") == []
    # The dead reservation no longer counts against the limit.
    assert cache.usage_bytes() == 0
    cache.prefetch("v/z", logging_fetch("v/z", 100_000, tmp_path / "log"), size=100_000)
    assert cache.stats().evictions == 0 and cache.stats().over_limit == 0


def test_sigkilled_lease_holder_does_not_block_eviction(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    root = tmp_path / "cache"
    ready = tmp_path / "ready"
    holder = ctx.Process(target=hold_lease_forever, args=(str(root), "v/x", 1000, str(ready)))
    holder.start()
    wait_for(ready)
    assert holder.pid is not None
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(JOIN_S)
    cache = ShardCache(root, limit_bytes=2000)
    log = tmp_path / "log"
    for key in ("v/a", "v/b"):
        cache.prefetch(key, logging_fetch(key, 1000, log), size=1000)
    assert not (root / "data" / "v%2Fx").exists()
    stats = cache.stats()
    assert stats.evictions == 1 and stats.over_limit == 0


def test_forked_child_counts_its_own_stats(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache")
    cache.prefetch("v/a", logging_fetch("v/a", 1000, tmp_path / "log"), size=1000)
    out = tmp_path / "out.json"
    child = mp.get_context("fork").Process(target=report_stats, args=(cache, "v/a", str(out)))
    child.start()
    child.join(JOIN_S)
    assert child.exitcode == 0
    result = json.loads(out.read_text())
    assert result["ok"] and result["before"]["misses"] == 0 and result["before"]["downloads"] == 0
    assert result["after"]["hits"] == 1
    assert cache.stats().downloads == 1 and cache.stats().hits == 0


def test_random_sigkills_never_corrupt_block_or_overshoot(tmp_path: Path) -> None:
    """Four processes lease random shards under a tight limit while one of them is
    SIGKILLed (mid-download, mid-lease, anywhere) and replaced every ~0.15 s."""
    ctx = mp.get_context("fork")
    rng = random.Random(3)
    root = tmp_path / "cache"
    shards = {f"v{i % 4}/s.{i:05d}": rng.randint(10_000, 100_000) for i in range(24)}
    limit = 5 * 100_000  # 4 leases + 1 download always fit: no over-limit excuse
    procs: list[Any] = [None] * 4

    def start(i: int) -> None:
        out = str(tmp_path / f"out{i}")
        args = (str(root), limit, shards, rng.randrange(1 << 30), out)
        procs[i] = ctx.Process(target=lease_forever, args=args)
        procs[i].start()

    for i in range(4):
        start(i)
    # at least 4 s and 10 kills (a loaded machine restarts workers slowly), at most 30 s
    kills, began = 0, time.monotonic()
    try:
        while time.monotonic() - began < 30 and (time.monotonic() - began < 4.0 or kills < 10):
            time.sleep(rng.random() * 0.3)
            i = rng.randrange(4)
            assert procs[i].exitcode is None, (tmp_path / f"out{i}").read_text()
            os.kill(procs[i].pid, signal.SIGKILL)
            procs[i].join(JOIN_S)
            kills += 1
            start(i)
    finally:
        for p in procs:
            alive = p.exitcode is None
            os.kill(p.pid, signal.SIGKILL)
            p.join(JOIN_S)
            assert alive, "a worker failed; see its out file"
    assert kills >= 10
    cache = ShardCache(root, limit_bytes=limit)  # a new run: dead leftovers swept
    assert os.listdir(root / "tmp") == [] and os.listdir(root / "locks") == []
    assert cache.usage_bytes() <= limit
    for key, size in shards.items():
        with cache.lease(key, logging_fetch(key, size, tmp_path / "log"), size=size) as path:
            assert path.read_bytes() == content(key, size)
    assert cache.stats().over_limit == 0
