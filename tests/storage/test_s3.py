"""S3Store against moto's S3 server over real HTTP on loopback."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from pathlib import Path

import httpx
import pytest

from shardstream.errors import (
    ObjectNotFoundError,
    StoragePermissionError,
    TransientStorageError,
)
from shardstream.hashing import hash_bytes
from shardstream.storage import S3Store, StorageOptions, open_store
from tests.fixtures.s3 import S3Bucket

MiB = 1 << 20


def test_roundtrip_through_standard_aws_environment(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    store = open_store(f"{s3_bucket.url}/datasets/v1")  # endpoint + keys from AWS_* only
    store.write_bytes("b/two.bin", b"22")
    store.write_bytes("a/one.bin", b"1")
    store.write_bytes("empty.bin", b"")
    src = tmp_path / "src.bin"
    src.write_bytes(b"333")
    store.upload(src, "b/c/three.bin")
    s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="datasets/v10/x", Body=b"no")

    assert store.read_bytes("b/c/three.bin") == b"333"
    assert store.read_bytes("empty.bin") == b""
    assert store.size("b/two.bin") == 2 and store.size("nope") is None
    assert list(store.list()) == [
        ("a/one.bin", 1),
        ("b/c/three.bin", 3),
        ("b/two.bin", 2),
        ("empty.bin", 0),
    ]  # not datasets/v10/x: the prefix is a directory, not a string prefix
    assert list(store.list("b/t")) == [("b/two.bin", 2)]
    raw = s3_bucket.client().get_object(Bucket=s3_bucket.name, Key="datasets/v1/b/two.bin")
    assert raw["Body"].read() == b"22"

    dest = tmp_path / "empty.out"
    store.download("empty.bin", dest, expected_size=0)
    assert dest.read_bytes() == b""
    store.delete("b/two.bin")
    store.delete("b/two.bin")  # S3 semantics: deleting a missing key is fine
    assert store.size("b/two.bin") is None


def test_large_objects_use_multipart_upload_and_parallel_ranged_download(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    store = S3Store(s3_bucket.name, "big", StorageOptions(part_size=5 * MiB, max_connections=4))
    data = os.urandom(12 * MiB + 12345)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store.upload(src, "shard.mds")
    head = s3_bucket.client().head_object(Bucket=s3_bucket.name, Key="big/shard.mds")
    assert head["ETag"].strip('"').endswith("-3")  # a 3-part multipart upload
    assert s3_bucket.client().list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads") is None

    store.write_bytes("from_memory.mds", data)  # write_bytes goes multipart as well
    head = s3_bucket.client().head_object(Bucket=s3_bucket.name, Key="big/from_memory.mds")
    assert head["ETag"].strip('"').endswith("-3")

    dest = tmp_path / "out.mds"
    hashes = {"sha1": hash_bytes("sha1", data)}
    store.download("shard.mds", dest, expected_size=len(data), expected_hashes=hashes)
    assert dest.read_bytes() == data
    assert store.read_bytes("from_memory.mds") == data


def test_errors_are_translated_and_name_the_object(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(f"{s3_bucket.url}/p")
    with pytest.raises(ObjectNotFoundError, match=f"s3://{s3_bucket.name}/p/missing.bin"):
        store.read_bytes("missing.bin")
    with pytest.raises(ObjectNotFoundError, match=r"missing\.bin"):
        store.download("missing.bin", tmp_path / "x")
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(ObjectNotFoundError, match="bucket does not exist"):
        open_store("s3://no-such-bucket-shardstream/x").read_bytes("k")

    unreachable = S3Store(
        s3_bucket.name,
        options=StorageOptions(endpoint_url="http://127.0.0.1:9", retries=2, backoff_base_s=0.01),
    )
    with pytest.raises(TransientStorageError, match=r"gave up after 2 attempts") as info:
        unreachable.read_bytes("k.bin")
    assert f"s3://{s3_bucket.name}/k.bin" in str(info.value)

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StoragePermissionError, match="AWS_ACCESS_KEY_ID"):
        open_store(s3_bucket.url).write_bytes("k", b"x")


def test_presigned_get_is_fetchable_without_credentials(s3_bucket: S3Bucket) -> None:
    store = S3Store(s3_bucket.name, "pre")
    store.write_bytes("a b/c.bin", b"payload")
    url = store.presign_get("a b/c.bin", expires_s=600)
    assert "X-Amz-Expires=600" in url
    assert httpx.get(url).content == b"payload"


def _child_read(store: S3Store, conn: multiprocessing.connection.Connection) -> None:
    data = store.read_bytes("obj.bin")
    conn.send((os.getpid(), store._client._pid, data))


def test_store_works_in_forked_and_spawned_workers(s3_bucket: S3Bucket) -> None:
    store = S3Store(s3_bucket.name, options=StorageOptions(endpoint_url=s3_bucket.endpoint_url))
    store.write_bytes("obj.bin", b"forked")  # the parent's client and pool now exist
    parent_client = store._client.get()

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_read, args=(store, send))
    child.start()
    child_pid, client_pid, data = recv.recv()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert data == b"forked"
    assert client_pid == child_pid != os.getpid()  # the child built its own client
    assert store._client.get() is parent_client  # and the parent's is untouched

    clone = pickle.loads(pickle.dumps(store))  # spawn-style workers pickle the dataset
    assert clone._client.built() is None
    assert clone.read_bytes("obj.bin") == b"forked"


def test_close_releases_the_connections_and_the_store_stays_usable(s3_bucket: S3Bucket) -> None:
    store = S3Store(s3_bucket.name)
    store.write_bytes("a.bin", b"abc")
    client = store._client.get()
    store.close()
    assert store._client.built() is None
    assert store.read_bytes("a.bin") == b"abc"  # a new client
    assert store._client.get() is not client
    store.close()
