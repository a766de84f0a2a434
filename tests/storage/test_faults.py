"""Transfers through a fault-injecting proxy in front of moto: retried, resumed, verified."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardstream.errors import (
    HashMismatchError,
    StoragePermissionError,
    TransientStorageError,
)
from shardstream.hashing import hash_bytes
from shardstream.storage import S3Store, StorageOptions
from tests.fixtures.faulty_proxy import Faults, FaultyProxy
from tests.fixtures.s3 import S3Bucket

KiB, MiB = 1 << 10, 1 << 20
S3_READ_CHUNK = 64 * KiB  # what one cut can cost at most (shardstream.storage._s3._CHUNK)


def _stores(bucket: S3Bucket, proxy: FaultyProxy, **options: object) -> tuple[S3Store, S3Store]:
    """(a store through the proxy, a direct store for arranging and checking)."""
    opts = {"part_size": 256 * KiB, "backoff_base_s": 0.01, "backoff_max_s": 0.05, **options}
    faulty = S3Store(
        bucket.name,
        "data",
        StorageOptions(endpoint_url=proxy.endpoint_url, **opts),  # type: ignore[arg-type]
    )
    return faulty, S3Store(bucket.name, "data")


def _temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(".shardstream-tmp")]


def test_ranged_download_survives_errors_and_cuts_without_refetching(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    # At these fault rates a part's last few KiB can fail repeatedly before progressing
    # (a cut inside one 64 KiB read loses that read), so allow more attempts than usual.
    faulty, direct = _stores(s3_bucket, faulty_proxy, max_connections=4, retries=12)
    data = os.urandom(4 * MiB + 1000)  # 17 parts of 256 KiB
    direct.write_bytes("shard.mds", data)
    faulty_proxy.faults = Faults(error_rate=0.3, cut_rate=0.5)

    dest = tmp_path / "shard.mds"
    hashes = {"xxh3_64": hash_bytes("xxh3_64", data)}
    faulty.download("shard.mds", dest, expected_size=len(data), expected_hashes=hashes)

    assert dest.read_bytes() == data
    stats = faulty_proxy.stats
    assert stats["errors"] >= 2 and stats["cuts"] >= 2, stats
    faulty_proxy.settle()
    gets = [e for e in faulty_proxy.log if e.path.split("?")[0].endswith("/data/shard.mds")]
    assert all(e.range is not None for e in gets)  # only ranged GETs, never the whole object
    # Resumed parts ask only for the bytes they lack: what was sent exceeds the object by
    # at most the unread tail of each cut response, never a whole part.
    overfetch = faulty_proxy.bytes_sent("/data/shard.mds") - len(data)
    assert 0 <= overfetch <= stats["cuts"] * S3_READ_CHUNK, (overfetch, stats)
    assert faulty_proxy.max_in_flight <= 4
    assert _temp_files(tmp_path) == []


def test_stalled_responses_time_out_and_are_retried(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy, read_timeout_s=0.4)
    data = os.urandom(1 * MiB)
    direct.write_bytes("stall.bin", data)
    faulty_proxy.faults = Faults(stall_rate=0.4, stall_s=1.0)

    assert faulty.read_bytes("stall.bin") == data
    assert faulty_proxy.stats["stalls"] >= 1


def test_multipart_upload_survives_errors(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy, part_size=5 * MiB, max_connections=3)
    data = os.urandom(11 * MiB)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    faulty_proxy.faults = Faults(error_rate=0.3)

    faulty.upload(src, "up.bin")
    faulty.write_bytes("small.bin", b"tiny")

    assert faulty_proxy.stats["errors"] >= 1
    assert direct.read_bytes("up.bin") == data and direct.read_bytes("small.bin") == b"tiny"
    head = s3_bucket.client().head_object(Bucket=s3_bucket.name, Key="data/up.bin")
    assert head["ETag"].strip('"').endswith("-3")
    assert s3_bucket.client().list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads") is None


def test_corrupted_bytes_never_become_visible(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy)
    data = os.urandom(600 * KiB)
    direct.write_bytes("shard.mds", data)
    faulty_proxy.faults = Faults(corrupt_rate=1.0, cut_rate=0.3)

    dest = tmp_path / "shard.mds"
    for hashes in ({"sha1": hash_bytes("sha1", data)}, {"xxh3_64": hash_bytes("xxh3_64", data)}):
        with pytest.raises(HashMismatchError, match=r"s3://.*/data/shard\.mds"):
            faulty.download("shard.mds", dest, expected_size=len(data), expected_hashes=hashes)
        assert not dest.exists()
        assert _temp_files(tmp_path) == []
    assert faulty_proxy.stats["corrupted"] >= 3


def test_giving_up_raises_transient_error_after_exactly_the_configured_attempts(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy, retries=3)
    direct.write_bytes("k.bin", b"x" * 1000)
    faulty_proxy.faults = Faults(error_rate=1.0)

    with pytest.raises(
        TransientStorageError, match=r"data/k\.bin.*(SlowDown|InternalError|ServiceUnavailable)"
    ):
        faulty.download("k.bin", tmp_path / "k.bin")
    # botocore's own retries are off: the attempts are exactly StorageOptions.retries.
    assert faulty_proxy.stats["requests"] == 3
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TransientStorageError):
        faulty.write_bytes("k.bin", b"y")
    assert direct.read_bytes("k.bin") == b"x" * 1000


def test_access_denied_is_a_permission_error_and_not_retried(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy)
    direct.write_bytes("k.bin", b"x")
    faulty_proxy.faults = Faults(deny=True)
    operations: list[Callable[[], object]] = [
        lambda: faulty.read_bytes("k.bin"),
        lambda: faulty.download("k.bin", tmp_path / "k"),
        lambda: faulty.write_bytes("k.bin", b"y"),
        lambda: list(faulty.list()),
        lambda: faulty.size("k.bin"),
    ]
    for op in operations:
        with pytest.raises(StoragePermissionError, match=r"access denied.*credentials"):
            op()
    assert faulty_proxy.stats["requests"] == len(operations)
    assert list(tmp_path.iterdir()) == []


def test_concurrent_downloads_share_one_bounded_set_of_connections(
    s3_bucket: S3Bucket, faulty_proxy: FaultyProxy, tmp_path: Path
) -> None:
    faulty, direct = _stores(s3_bucket, faulty_proxy, max_connections=3)
    blobs = {f"s{i}.bin": os.urandom(1 * MiB) for i in range(3)}
    for key, blob in blobs.items():
        direct.write_bytes(key, blob)
    faulty_proxy.faults = Faults(latency_s=0.03)

    threads = [
        threading.Thread(target=faulty.download, args=(key, tmp_path / key)) for key in blobs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {key: (tmp_path / key).read_bytes() for key in blobs} == blobs
    assert 2 <= faulty_proxy.max_in_flight <= 3
