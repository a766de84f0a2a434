"""The bytes a reader gets are the published bytes, and a damaged cache never blocks a job.

Each test damages a shared node cache the way a disk, a user or a crash would (a flipped
byte of the same size, truncation, zeroing, a lost marker), then reads it from another
process, and checks what that process got: the published samples, and whether the shard
was fetched again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.client import CacheOptions, StreamingDataset
from shardstream.client.cache.keys import key_to_name
from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.cache.verify import BOOT_ID, read_marker
from shardstream.errors import ConfigError, CorruptShardError
from shardstream.hashing import hash_bytes
from tests.fixtures.datasets import ids_of, token_row, write_tokens

SIZE = 64 << 10


def published(key: str) -> bytes:
    return hashlib.shake_256(key.encode()).digest(SIZE)


def hashes_of(key: str) -> dict[str, str]:
    return {"xxh3_64": hash_bytes("xxh3_64", published(key))}


def _lease_in_child(root: str, key: str, out: Any) -> None:
    """Another process of the node: lease ``key`` and report (bytes, fetches, repairs)."""
    calls: list[str] = []

    def fetch(tmp: Path) -> None:
        calls.append(key)
        tmp.write_bytes(published(key))

    cache = ShardCache(Path(root))
    with cache.lease(key, fetch, size=SIZE, hashes=hashes_of(key)) as path:
        data = path.read_bytes()
    out.put((data == published(key), len(calls), cache.stats().repaired))


def lease_elsewhere(root: Path, key: str) -> tuple[bool, int, int]:
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    proc = ctx.Process(target=_lease_in_child, args=(str(root), key, out))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    result: tuple[bool, int, int] = out.get(timeout=5)
    return result


def fill(root: Path, key: str) -> Path:
    cache = ShardCache(root)
    cache.prefetch(
        key, lambda tmp: tmp.write_bytes(published(key)), size=SIZE, hashes=hashes_of(key)
    )
    return root / "data" / key_to_name(key)


def flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_a_flipped_byte_of_the_same_size_is_caught_and_refetched(tmp_path: Path) -> None:
    key = "v1/xxh3_64-x/shard.00000.mds"
    path = fill(tmp_path, key)
    assert lease_elsewhere(tmp_path, key) == (True, 0, 0)  # a warm hit: no fetch
    flip_byte(path, SIZE // 2)
    assert path.stat().st_size == SIZE
    assert lease_elsewhere(tmp_path, key) == (True, 1, 1)  # published bytes, fetched again
    assert (tmp_path / "data" / key_to_name(key)).read_bytes() == published(key)
    assert lease_elsewhere(tmp_path, key) == (True, 0, 0)  # and trusted again


def test_a_change_seen_by_a_process_that_already_trusted_the_file(tmp_path: Path) -> None:
    key = "v1/a"
    cache = ShardCache(tmp_path)
    calls: list[int] = []

    def fetch(tmp: Path) -> None:
        calls.append(1)
        tmp.write_bytes(published(key))

    with cache.lease(key, fetch, size=SIZE, hashes=hashes_of(key)) as path:
        flip_byte(path, 0)
    with cache.lease(key, fetch, size=SIZE, hashes=hashes_of(key)) as path:
        assert path.read_bytes() == published(key)
    assert len(calls) == 2 and cache.stats().repaired == 1


@pytest.mark.parametrize("damage", ["truncate", "zero", "empty"])
def test_a_truncated_or_zeroed_cached_shard_is_fetched_again(tmp_path: Path, damage: str) -> None:
    key = "v1/shard"
    path = fill(tmp_path, key)
    if damage == "truncate":
        os.truncate(path, SIZE - 100)
    elif damage == "zero":
        path.write_bytes(bytes(SIZE))
    else:
        os.truncate(path, 0)
    assert lease_elsewhere(tmp_path, key) == (True, 1, 1)


def test_a_lost_marker_costs_a_hash_not_a_download(tmp_path: Path) -> None:
    key = "v1/shard"
    fill(tmp_path, key)
    markers = list((tmp_path / "verified").iterdir())
    assert len(markers) == 1
    markers[0].unlink()
    assert lease_elsewhere(tmp_path, key) == (True, 0, 0)
    assert len(list((tmp_path / "verified").iterdir())) == 1  # vouched for again


def test_an_unhashed_shard_without_its_marker_is_fetched_again(tmp_path: Path) -> None:
    """No published hash: the digest taken at download is the only reference."""
    key = "v1/unhashed"
    cache = ShardCache(tmp_path)
    calls: list[int] = []

    def fetch(tmp: Path) -> None:
        calls.append(1)
        tmp.write_bytes(published(key))

    cache.prefetch(key, fetch, size=SIZE)
    path = tmp_path / "data" / key_to_name(key)
    flip_byte(path, 10)
    with cache.lease(key, fetch, size=SIZE) as got:  # the recorded digest catches it
        assert got.read_bytes() == published(key)
    next(iter((tmp_path / "verified").iterdir())).unlink()
    with ShardCache(tmp_path).lease(key, fetch, size=SIZE) as got:  # as a new process would
        assert got.read_bytes() == published(key)
    assert len(calls) == 3


def test_a_bad_source_raises_a_clear_error_and_caches_nothing(tmp_path: Path) -> None:
    key = "v1/bad"
    cache = ShardCache(tmp_path)
    wrong = bytearray(published(key))
    wrong[5] ^= 0xFF
    with pytest.raises(CorruptShardError, match=r"v1/bad.*do not match its published hash"):
        cache.prefetch(key, lambda tmp: tmp.write_bytes(wrong), size=SIZE, hashes=hashes_of(key))
    assert os.listdir(tmp_path / "data") == [] and os.listdir(tmp_path / "tmp") == []
    cache.prefetch(
        key, lambda tmp: tmp.write_bytes(published(key)), size=SIZE, hashes=hashes_of(key)
    )


def test_a_fetch_that_verified_its_bytes_is_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch that returns True checked every byte against the published digests (a
    ranged fill whose blocks all matched theirs, a whole download checked against the file
    hash): the cache publishes it without reading it again, under a marker holding the
    published digest that other processes trust. Any other fetch is hashed."""
    import shardstream.client.cache.verify as verify

    hashed: list[str] = []
    real = verify.digest_fd

    def counting(fd: int, algo: str) -> str:
        hashed.append(algo)
        return real(fd, algo)

    monkeypatch.setattr(verify, "digest_fd", counting)
    cache = ShardCache(tmp_path)

    def vouching(key: str) -> Any:
        return lambda tmp: tmp.write_bytes(published(key)) and True

    cache.prefetch("v1/a", vouching("v1/a"), size=SIZE, hashes=hashes_of("v1/a"))
    assert hashed == []
    marker = read_marker(tmp_path / "verified" / f"{key_to_name('v1/a')}.ok")
    assert marker is not None and marker.digest == hashes_of("v1/a")["xxh3_64"]
    assert lease_elsewhere(tmp_path, "v1/a") == (True, 0, 0)  # trusted, not fetched again

    cache.prefetch(
        "v1/b", lambda t: t.write_bytes(published("v1/b")), size=SIZE, hashes=hashes_of("v1/b")
    )
    assert hashed == ["xxh3_64"]
    # Vouched but with no published hash to record: its own digest is taken.
    cache.prefetch("v1/c", vouching("v1/c"), size=SIZE, hashes={})
    assert len(hashed) == 2


# -- through the dataset ------------------------------------------------------------------


def _read_in_child(url: str, cache: str, out: Any) -> None:
    ds = StreamingDataset(url, 4, cache=CacheOptions(dir=Path(cache)))
    got: dict[int, list[int]] = {}
    for batch in ds:
        for i, row in zip(ids_of(batch), np.asarray(batch["tokens"]), strict=True):
            got[i] = row.tolist()
    out.put(got)


def read_elsewhere(url: str, cache: Path) -> dict[int, list[int]]:
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    proc = ctx.Process(target=_read_in_child, args=(url, str(cache), out))
    proc.start()
    got: dict[int, list[int]] = out.get(timeout=120)
    proc.join(60)
    assert proc.exitcode == 0
    return got


def test_a_reader_gets_the_published_samples_from_a_damaged_cache(tmp_path: Path) -> None:
    n = 60
    write_tokens(tmp_path / "ds", n, size_limit=600)
    url, cache = str(tmp_path / "ds" / "index.json"), tmp_path / "cache"
    expected = {i: token_row(i).tolist() for i in range(n)}
    assert read_elsewhere(url, cache) == expected
    cached = sorted((cache / "data").iterdir())
    published_bytes = {p.name: p.read_bytes() for p in cached}
    flip_byte(cached[0], cached[0].stat().st_size - 3)  # a token of the last sample
    os.truncate(cached[1], 100)
    assert read_elsewhere(url, cache) == expected
    # The damaged files were fetched again (inode numbers prove nothing: a new file may get
    # the evicted one's number), the others are still there as they were.
    after = {p.name: p.read_bytes() for p in (cache / "data").iterdir()}
    assert after == published_bytes


def test_shards_without_a_usable_hash_warn_once_or_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_tokens(tmp_path / "ds", 40, size_limit=600)
    index_path = tmp_path / "ds" / "index.json"
    obj = json.loads(index_path.read_text())
    for number, shard in enumerate(obj["shards"]):  # MosaicML's default: no hashes at all,
        digests = shard["raw_data"]["hashes"]  # or only ones the client cannot compute
        shard["raw_data"]["hashes"] = {} if number % 2 else {"blake9": digests["sha1"]}
    index_path.write_text(json.dumps(obj))
    url = str(index_path)
    with caplog.at_level(logging.WARNING):
        StreamingDataset(url, 4, cache=CacheOptions(dir=tmp_path / "c"))
        StreamingDataset(url, 4, cache=CacheOptions(dir=tmp_path / "c"))
    warnings = [r for r in caplog.records if "record no hash" in r.getMessage()]
    assert len(warnings) == 1 and "shard.00000.mds" in warnings[0].getMessage()
    with pytest.raises(ConfigError, match=r"shards \(first: shard.00000.mds\) record no hash"):
        StreamingDataset(url, 4, cache=CacheOptions(dir=tmp_path / "c", require_hashes=True))


def test_a_marker_from_another_boot_is_checked_again(tmp_path: Path) -> None:
    """After a crash a file's pages may not be the bytes that were hashed: hash once more."""
    key = "v1/shard"
    fill(tmp_path, key)
    marker = next(iter((tmp_path / "verified").iterdir()))
    fields = marker.read_text().split()
    fields[1] = "an-earlier-boot"
    marker.write_text(" ".join(fields) + "\n")
    before = read_marker(marker)
    assert before is not None and before.boot == "an-earlier-boot"
    assert lease_elsewhere(tmp_path, key) == (True, 0, 0)  # hashed, matched: no download
    again = read_marker(marker)
    assert again is not None and again.boot == BOOT_ID
