"""The ObjectStore contract, checked identically on every writable backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstream.errors import ConfigError, HashMismatchError, ObjectNotFoundError
from shardstream.hashing import hash_bytes
from shardstream.storage import ObjectStore, S3Store, StorageOptions, open_store

KiB = 1 << 10


@pytest.fixture(params=["local", "s3", "s3-no-prefix"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield open_store(tmp_path / "root")
        return
    bucket = request.getfixturevalue("s3_bucket")
    prefix = "" if request.param == "s3-no-prefix" else "data"
    # Small parts so that the parallel ranged path runs on small objects too.
    with S3Store(bucket.name, prefix, StorageOptions(part_size=64 * KiB)) as s3:
        yield s3


def test_roundtrip_and_listing(store: ObjectStore, tmp_path: Path) -> None:
    blobs = {
        "a/one.bin": b"1",
        "b/two.bin": b"22",
        "b/c/three.bin": b"333",
        "b2/four.bin": b"4444",
        "empty.bin": b"",
        "big.bin": os.urandom(300 * KiB + 7),  # 5 ranged parts
    }
    for key, blob in blobs.items():
        if key.startswith("b/c"):
            src = tmp_path / "src.bin"
            src.write_bytes(blob)
            store.upload(src, key)
        else:
            store.write_bytes(key, blob)

    for key, blob in blobs.items():
        assert store.read_bytes(key) == blob
        assert store.size(key) == len(blob) and store.exists(key)
    assert list(store.list()) == sorted((k, len(v)) for k, v in blobs.items())
    assert list(store.list("b/")) == [("b/c/three.bin", 3), ("b/two.bin", 2)]
    assert [k for k, _ in store.list("b")] == [
        "b/c/three.bin",
        "b/two.bin",
        "b2/four.bin",
        "big.bin",
    ]
    assert list(store.list("b/c/")) == [("b/c/three.bin", 3)]
    assert list(store.list("nothing/")) == []
    assert store.size("b") is None and store.size("missing") is None

    store.write_bytes("a/one.bin", b"replaced")
    assert store.read_bytes("a/one.bin") == b"replaced"
    store.delete("a/one.bin")
    store.delete("a/one.bin")
    assert not store.exists("a/one.bin")
    assert store.url("x/y.bin").endswith("/x/y.bin")


def test_download_is_verified_and_atomic(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(200 * KiB)
    store.write_bytes("shard.mds", data)
    dest = tmp_path / "dest" / "shard.mds"
    dest.parent.mkdir()
    right = {"xxh3_64": hash_bytes("xxh3_64", data), "sha1": hash_bytes("sha1", data)}
    wrong = {"sha1": hash_bytes("sha1", data + b"!")}

    with pytest.raises(HashMismatchError, match="size is 204800 bytes"):
        store.download("shard.mds", dest, expected_size=len(data) + 1, expected_hashes=right)
    with pytest.raises(HashMismatchError, match="sha1"):
        store.download("shard.mds", dest, expected_size=len(data), expected_hashes=wrong)
    with pytest.raises(ObjectNotFoundError, match="missing"):
        store.download("missing.mds", dest)
    assert list(dest.parent.iterdir()) == []  # no result, no temp file

    store.download("shard.mds", dest, expected_size=len(data), expected_hashes=right)
    assert dest.read_bytes() == data
    store.write_bytes("empty", b"")
    store.download("empty", dest, expected_size=0)  # replaces the old file atomically
    assert dest.read_bytes() == b""


@pytest.mark.parametrize("key", ["../x", "/x", "a\\b", "a/../../x", "a//b", ""])
def test_keys_cannot_escape(store: ObjectStore, key: str, tmp_path: Path) -> None:
    for op in (
        lambda: store.read_bytes(key),
        lambda: store.write_bytes(key, b"x"),
        lambda: store.size(key),
        lambda: store.delete(key),
        lambda: store.download(key, tmp_path / "d"),
    ):
        with pytest.raises(ConfigError, match="invalid object key"):
            op()
    with pytest.raises(ConfigError):
        list(store.list("../"))
