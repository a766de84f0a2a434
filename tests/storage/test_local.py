"""LocalStore: atomic writes, keys that cannot escape the root, verified downloads."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardstream.errors import ConfigError, HashMismatchError, ObjectNotFoundError
from shardstream.hashing import hash_bytes
from shardstream.storage import LocalStore, open_store


def _leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*") if p.name.startswith(".shardstream-tmp")]


def test_roundtrip_list_size_delete(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "root")
    store.write_bytes("b/two.bin", b"22")
    store.write_bytes("a/one.bin", b"1")
    src = tmp_path / "src.bin"
    src.write_bytes(b"333")
    store.upload(src, "b/c/three.bin")

    assert store.read_bytes("b/c/three.bin") == b"333"
    assert store.size("b/two.bin") == 2 and store.size("missing") is None
    assert store.size("b") is None  # a directory is not an object
    assert list(store.list()) == [("a/one.bin", 1), ("b/c/three.bin", 3), ("b/two.bin", 2)]
    assert list(store.list("b/")) == [("b/c/three.bin", 3), ("b/two.bin", 2)]
    assert list(store.list("b/t")) == [("b/two.bin", 2)]
    assert list(store.list("zzz/")) == []
    store.delete("b/two.bin")
    store.delete("b/two.bin")  # idempotent
    assert not store.exists("b/two.bin")
    assert _leftovers(tmp_path) == []


def test_missing_object_is_object_not_found_naming_the_url(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    with pytest.raises(ObjectNotFoundError, match=r"nothing/here\.bin"):
        store.read_bytes("nothing/here.bin")
    with pytest.raises(ObjectNotFoundError, match=r"nothing/here\.bin"):
        store.download("nothing/here.bin", tmp_path / "dest")
    assert not (tmp_path / "dest").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("key", ["../escape", "/abs/key", "a\\..\\b", "a/../../b", ""])
def test_no_operation_can_escape_the_root(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    store = LocalStore(root)
    (tmp_path / "escape").write_bytes(b"secret")
    (tmp_path / "src").write_bytes(b"x")
    operations: list[Callable[[], object]] = [
        lambda: store.read_bytes(key),
        lambda: store.write_bytes(key, b"x"),
        lambda: store.upload(tmp_path / "src", key),
        lambda: store.download(key, tmp_path / "dest"),
        lambda: store.size(key),
        lambda: store.delete(key),
        lambda: store.url(key) if key else store.url("."),
    ]
    for op in operations:
        with pytest.raises(ConfigError, match="invalid object key"):
            op()
    assert (tmp_path / "escape").read_bytes() == b"secret"
    assert not root.exists()


def test_download_verifies_size_and_hash_before_anything_appears(tmp_path: Path) -> None:
    store = open_store(tmp_path / "root")
    data = os.urandom(100_000)
    store.write_bytes("shard.bin", data)
    dest = tmp_path / "out" / "shard.bin"
    dest.parent.mkdir()

    with pytest.raises(HashMismatchError, match="size is 100000 bytes, the index records 99999"):
        store.download("shard.bin", dest, expected_size=99_999)
    bad = {"xxh3_64": hash_bytes("xxh3_64", data[:-1] + b"\x00")}
    with pytest.raises(HashMismatchError, match=r"shard\.bin"):
        store.download("shard.bin", dest, expected_hashes=bad)
    assert not dest.exists() and _leftovers(tmp_path) == []

    good = {"sha1": hash_bytes("sha1", data), "xxh3_64": hash_bytes("xxh3_64", data)}
    store.download("shard.bin", dest, expected_size=len(data), expected_hashes=good)
    assert dest.read_bytes() == data


def test_readers_never_see_a_partial_write(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    versions = [bytes([i]) * 2_000_000 for i in range(5)]
    store.write_bytes("obj", versions[0])
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            store.write_bytes("obj", versions[i % len(versions)])

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        seen = {store.read_bytes("obj") for _ in range(200)}
    finally:
        stop.set()
        thread.join()
    assert seen <= set(versions)  # every read is one whole version, never a mix or a prefix
    assert _leftovers(tmp_path) == []


def test_failed_write_leaves_old_object_and_no_temp(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.write_bytes("obj", b"old")
    with pytest.raises(TypeError):
        store.write_bytes("obj", "not bytes")  # type: ignore[arg-type]
    assert store.read_bytes("obj") == b"old" and _leftovers(tmp_path) == []
