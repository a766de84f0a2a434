"""HTTPStore: presigned URLs resolved in batches, refreshed on expiry, read-only."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from shardstream.errors import (
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
)
from shardstream.hashing import hash_bytes
from shardstream.storage import HTTPStore, S3Store, StorageOptions, open_store
from tests.fixtures.faulty_proxy import Faults, FaultyProxy
from tests.fixtures.s3 import S3Bucket

KiB, MiB = 1 << 10, 1 << 20
OPTIONS = StorageOptions(part_size=256 * KiB, backoff_base_s=0.01, backoff_max_s=0.05)


class Presigner:
    """A resolver like the server's presign endpoint, recording each batch it gets."""

    def __init__(self, signer: S3Store, expires_s: list[int]) -> None:
        self.signer = signer
        self.expires_s = expires_s  # lifetime per call; the last one repeats
        self.batches: list[list[str]] = []

    def __call__(self, keys: list[str]) -> dict[str, str]:
        lifetime = self.expires_s[min(len(self.batches), len(self.expires_s) - 1)]
        self.batches.append(list(keys))
        return {k: self.signer.presign_get(k, lifetime) for k in keys}


def _signer(bucket: S3Bucket, proxy: FaultyProxy) -> S3Store:
    """Signs URLs that point at the proxy, and writes the test objects directly."""
    return S3Store(bucket.name, "ds", StorageOptions(endpoint_url=proxy.endpoint_url))


def test_downloads_resolve_urls_in_batches_and_verify(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    signer = _signer(s3_bucket, faulty_proxy)
    blobs = {f"shard.{i:05}.mds": os.urandom(300 * KiB + i) for i in range(5)}
    for key, blob in blobs.items():
        signer.write_bytes(key, blob)
    resolver = Presigner(signer, [3600])
    store = HTTPStore(resolver, options=OPTIONS, batch_size=4)

    store.resolve_urls(blobs)  # the client knows which shards come next
    faulty_proxy.faults = Faults(error_rate=0.2, cut_rate=0.3)
    for key, blob in blobs.items():
        hashes = {"sha1": hash_bytes("sha1", blob)}
        store.download(key, tmp_path / key, expected_size=len(blob), expected_hashes=hashes)
        assert (tmp_path / key).read_bytes() == blob
    assert resolver.batches == [list(blobs)[:4], list(blobs)[4:]]  # no per-key round trips
    assert store.size("shard.00001.mds") == len(blobs["shard.00001.mds"])
    assert faulty_proxy.stats["cuts"] >= 1 and faulty_proxy.stats["errors"] >= 1
    assert "X-Amz-Signature" in store.url("shard.00000.mds")


def test_expiring_urls_are_renewed_before_use(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy
) -> None:
    signer = _signer(s3_bucket, faulty_proxy)
    signer.write_bytes("k.bin", b"payload")
    resolver = Presigner(signer, [2, 3600])
    store = HTTPStore(resolver, options=OPTIONS)
    faulty_proxy.faults = Faults(enforce_presign_expiry=True)

    assert store.read_bytes("k.bin") == b"payload"
    time.sleep(2.1)  # the first URL is dead now
    assert store.read_bytes("k.bin") == b"payload"
    assert resolver.batches == [["k.bin"], ["k.bin"]]
    assert faulty_proxy.stats["expired"] == 0  # renewed from its X-Amz-Expires, no 403 seen


def test_url_rejected_as_expired_is_resolved_again(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    signer = _signer(s3_bucket, faulty_proxy)
    data = os.urandom(1 * MiB)  # 4 parts: all of them meet the expired URL
    signer.write_bytes("k.bin", data)
    resolver = Presigner(signer, [600, 7 * 24 * 3600])
    store = HTTPStore(resolver, options=OPTIONS)
    store.resolve_urls(["k.bin"])
    # The server's clock is an hour ahead: it sees the 10-minute URL as expired.
    faulty_proxy.faults = Faults(enforce_presign_expiry=True, clock_skew_s=3600)

    store.download("k.bin", tmp_path / "k.bin", expected_size=len(data))
    assert (tmp_path / "k.bin").read_bytes() == data
    assert faulty_proxy.stats["expired"] >= 1
    assert len(resolver.batches) == 2  # one renewal, however many parts saw the 403


def test_errors_are_translated(s3_bucket: S3Bucket, faulty_proxy: FaultyProxy) -> None:
    signer = _signer(s3_bucket, faulty_proxy)
    signer.write_bytes("k.bin", b"x")
    resolver = Presigner(signer, [3600])
    store = HTTPStore(resolver, options=OPTIONS)

    with pytest.raises(ObjectNotFoundError, match=r"/ds/missing\.bin"):
        store.read_bytes("missing.bin")
    assert store.size("missing.bin") is None
    with pytest.raises(ObjectNotFoundError) as info:
        store.read_bytes("m")
    assert "X-Amz-Signature" not in str(info.value)  # messages never carry the signature

    store.resolve_urls(["k.bin"])
    faulty_proxy.faults = Faults(deny=True)
    before = len(resolver.batches)
    with pytest.raises(StoragePermissionError, match=r"/ds/k\.bin: access denied.*resolved"):
        store.read_bytes("k.bin")
    assert len(resolver.batches) == before + 1  # tried one fresh URL before giving up

    broken = HTTPStore(lambda keys: {}, options=OPTIONS, name="server presign")
    with pytest.raises(StorageError, match="server presign: the resolver returned no URL for 'a'"):
        broken.read_bytes("a")

    def failing(keys: list[str]) -> dict[str, str]:
        raise RuntimeError("server down")

    with pytest.raises(StorageError, match="server down"):
        HTTPStore(failing).read_bytes("a")


def test_http_store_is_read_only(tmp_path: Path) -> None:
    store = HTTPStore.from_base_url("https://example.invalid/data")
    for op in (
        lambda: store.write_bytes("a", b"x"),
        lambda: store.upload(tmp_path, "a"),
        lambda: store.delete("a"),
        store.list,
    ):
        with pytest.raises(StorageError, match="read-only"):
            op()


def test_plain_https_urls_through_open_store(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    data = os.urandom(700 * KiB)
    s3_bucket.client().put_object(
        Bucket=s3_bucket.name, Key="ds/public/a b.bin", Body=data, ACL="public-read"
    )
    store = open_store(f"{faulty_proxy.endpoint_url}/{s3_bucket.name}/ds", OPTIONS)

    assert store.read_bytes("public/a b.bin") == data
    store.download("public/a b.bin", tmp_path / "out", expected_size=len(data))
    assert (tmp_path / "out").read_bytes() == data


def test_server_without_range_support_is_read_in_one_stream(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    signer = _signer(s3_bucket, faulty_proxy)
    data = os.urandom(1 * MiB + 5)  # 5 parts, if the server could do ranges
    signer.write_bytes("k.bin", data)
    store = HTTPStore(Presigner(signer, [3600]), options=OPTIONS)
    faulty_proxy.faults = Faults(ignore_range=True)

    store.download("k.bin", tmp_path / "k.bin", expected_size=len(data))
    assert (tmp_path / "k.bin").read_bytes() == data
    assert faulty_proxy.bytes_sent("/ds/k.bin") == len(data)  # one GET, not one per part

    # Without ranges a retry starts from byte 0 again and skips what it has: it makes no
    # progress unless it gets further than the last cut, so allow more attempts.
    patient = HTTPStore(Presigner(signer, [3600]), options=replace(OPTIONS, retries=12))
    faulty_proxy.faults = Faults(ignore_range=True, cut_rate=0.3)
    patient.download("k.bin", tmp_path / "again.bin", expected_size=len(data))
    assert (tmp_path / "again.bin").read_bytes() == data


def test_a_url_of_another_scheme_fails_at_once_without_retries(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def resolve(keys: list[str]) -> dict[str, str]:
        calls.append(keys)
        return {key: f"ftp://example.invalid/{key}" for key in keys}

    store = HTTPStore(resolve, options=StorageOptions(retries=6))
    with pytest.raises(StorageError, match="not an http") as info:
        store.download("shard.00000.mds", tmp_path / "out")
    assert not isinstance(info.value, TransientStorageError)
    assert len(calls) == 1
    assert not (tmp_path / "out").exists()


def test_the_shared_pool_closes_with_the_last_store_that_uses_it(s3_bucket: S3Bucket) -> None:
    """HTTPStores share one connection pool; it closes (its idle connections with it) once
    every store that used it is closed, and a store used again opens a new one."""
    S3Store(s3_bucket.name).write_bytes("a.bin", b"abc")
    url = S3Store(s3_bucket.name).presign_get("a.bin", expires_s=600)
    # Timeouts no other test uses: the pool is shared by options, and a store an earlier
    # test left open would still hold the default pool.
    options = StorageOptions(connect_timeout_s=9.25)
    first, second = (
        HTTPStore(lambda keys, u=url: {k: u for k in keys}, options=options) for _ in range(2)
    )
    assert first.read_bytes("a.bin") == second.read_bytes("a.bin") == b"abc"
    pool = first._http.get()
    assert second._http.get() is pool
    first.close()
    assert not pool.is_closed  # the second store still uses it
    second.close()
    assert pool.is_closed
    assert first.read_bytes("a.bin") == b"abc"  # a new pool
    first.close()
