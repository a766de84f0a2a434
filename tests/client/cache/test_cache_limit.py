"""The limit comes back: after pins are released, when a cache opens, and on command.

Pins held by other real processes keep shards; everything else is evicted back within
the limit without waiting for the next miss. ``shardstream cache stats|prune`` shows and
enforces it on a cache in use.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from shardstream.cli import main
from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.cli import parse_size
from shardstream.errors import ConfigError

SIZE = 10_000


def fetcher(key: str) -> Any:
    return lambda tmp: tmp.write_bytes(key.encode().ljust(SIZE, b"."))


def cached_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "data").iterdir())


def _hold(root: str, keys: list[str], ready: Any, go: Any) -> None:
    """Another process of the node: pin ``keys`` until told to release them."""
    cache = ShardCache(Path(root), limit_bytes=3 * SIZE)
    leases = [cache.acquire(k, fetcher(k), size=SIZE) for k in keys]
    ready.set()
    go.wait(60)
    for lease in leases:
        lease.release()


def test_releasing_pins_brings_the_cache_back_within_its_limit(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, limit_bytes=3 * SIZE)
    leases = [cache.acquire(f"v/{i}", fetcher(f"v/{i}"), size=SIZE) for i in range(8)]
    assert cached_bytes(tmp_path) == 8 * SIZE  # all pinned: allowed over, with a warning
    for lease in leases[:4]:
        lease.release()
    assert cached_bytes(tmp_path) == 4 * SIZE  # the four still pinned, nothing else
    for lease in leases[4:]:
        lease.release()
    assert cached_bytes(tmp_path) <= 3 * SIZE
    assert not (tmp_path / "over-limit").exists()
    # An all-hit pass over what is left keeps it there.
    for i in range(8):
        if cache.contains(f"v/{i}"):
            with cache.lease(f"v/{i}", fetcher(f"v/{i}"), size=SIZE):
                pass
    assert cached_bytes(tmp_path) <= 3 * SIZE


def test_pins_released_by_another_process_let_the_limit_come_back(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), ["a/0", "a/1", "a/2"], ready, go))
    holder.start()
    assert ready.wait(60)
    cache = ShardCache(tmp_path, limit_bytes=3 * SIZE)
    with cache.lease("b/0", fetcher("b/0"), size=SIZE):
        assert cached_bytes(tmp_path) == 4 * SIZE
    assert cached_bytes(tmp_path) == 3 * SIZE  # ours went; theirs are pinned
    go.set()
    holder.join(60)
    assert holder.exitcode == 0
    assert cached_bytes(tmp_path) <= 3 * SIZE


def test_opening_a_cache_evicts_back_to_its_limit(tmp_path: Path) -> None:
    unbounded = ShardCache(tmp_path)
    for i in range(17):
        unbounded.prefetch(f"v/{i}", fetcher(f"v/{i}"), size=SIZE)
    ShardCache(tmp_path, limit_bytes=3 * SIZE)
    assert cached_bytes(tmp_path) <= 3 * SIZE
    names = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert names == sorted(p.name.removesuffix(".ok") for p in (tmp_path / "verified").iterdir())


def test_cache_stats_and_prune_respect_pins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path), ["p/0"], ready, go))
    holder.start()
    try:
        assert ready.wait(60)
        cache = ShardCache(tmp_path, limit_bytes=3 * SIZE)
        for i in range(3):
            cache.prefetch(f"v/{i}", fetcher(f"v/{i}"), size=SIZE)
        assert main(["cache", "stats", str(tmp_path), "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["entries"] == 3 and stats["bytes"] == 3 * SIZE
        assert stats["limit_bytes"] == 3 * SIZE and stats["pinned"] == 1
        assert main(["cache", "prune", str(tmp_path), "--limit", str(SIZE), "--json"]) == 0
        pruned = json.loads(capsys.readouterr().out)
        assert pruned == {
            "evicted": 2,
            "evicted_bytes": 2 * SIZE,
            "bytes": SIZE,
            "limit_bytes": SIZE,
            "over_limit": False,
        }
        assert [p.name for p in (tmp_path / "data").iterdir()] == ["p%2F0"]  # the pinned one
        assert main(["cache", "prune", str(tmp_path), "--limit", "1"]) == 0
        assert "still over" in capsys.readouterr().out
        assert cached_bytes(tmp_path) == SIZE
    finally:
        go.set()
        holder.join(60)
    assert main(["cache", "stats", str(tmp_path / "nope")]) == 1


def test_sizes_read_like_people_write_them() -> None:
    assert parse_size("500M") == 500 << 20
    assert parse_size("64GiB") == 64 << 30
    assert parse_size("1234") == 1234
    with pytest.raises(ConfigError, match="cannot read size"):
        parse_size("lots")


def test_after_an_epoch_over_a_too_small_limit_the_cache_is_back_within_it(
    tmp_path: Path,
) -> None:
    """The issue's case: a 3-shard limit, a whole epoch read; nothing in use at the end."""
    from shardstream.client import CacheOptions, StreamingDataset
    from tests.fixtures.datasets import ids_of, write_tokens

    write_tokens(tmp_path / "ds", 400, size_limit=600)
    shard = max(p.stat().st_size for p in (tmp_path / "ds").glob("*.mds"))
    options = CacheOptions(dir=tmp_path / "cache", limit_bytes=3 * shard, open_shards=1)
    ds = StreamingDataset(str(tmp_path / "ds" / "index.json"), 8, cache=options)
    for _ in range(2):  # a cold epoch, then an all-hit one over what is left
        assert sorted(i for b in ds for i in ids_of(b)) == list(range(400))
        assert cached_bytes(tmp_path / "cache") <= 3 * shard
