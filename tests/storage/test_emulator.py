"""The cloud emulator shows each property it models: latency, per-connection bandwidth,
per-prefix request limits, faults, and counters that add up.

Timings are asserted only as lower bounds implied by the model (a paced body cannot
arrive faster than its rate), or with a margin of several times against the alternative
the test rules out.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from shardstream.errors import HashMismatchError
from shardstream.hashing import hash_bytes
from shardstream.storage import HTTPStore, S3Store, StorageOptions
from tests.fixtures.cloud_emulator import CloudEmulator, offered
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

KiB, MiB, MB = 1 << 10, 1 << 20, 1_000_000


class Client:
    """Presigned GETs through the emulator on one keep-alive connection (raw, so the
    test sees every status and byte)."""

    def __init__(self, bucket: S3Bucket, emulator: CloudEmulator) -> None:
        self.s3 = bucket.client()
        self.bucket = bucket.name
        self.endpoint = emulator.endpoint_url
        parts = urlsplit(emulator.endpoint_url)
        self.conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)

    def put(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)  # straight to moto

    def url(self, key: str, method: str = "get_object") -> str:
        params = {"Bucket": self.bucket, "Key": key}
        url = self.s3.generate_presigned_url(method, Params=params, ExpiresIn=600)
        parts = urlsplit(url)
        return f"{parts.path}?{parts.query}"

    def get(self, key: str, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
        method = "HEAD" if headers and headers.pop("method", "") == "HEAD" else "GET"
        target = self.url(key, "head_object" if method == "HEAD" else "get_object")
        self.conn.request(method, target, headers=headers or {})
        resp = self.conn.getresponse()
        return resp.status, resp.headers, resp.read()


@pytest.fixture
def client(s3_bucket: S3Bucket, cloud_emulator: CloudEmulator) -> Client:
    return Client(s3_bucket, cloud_emulator)


def test_first_byte_latency_is_added_to_every_request(
    client: Client, cloud_emulator: CloudEmulator
) -> None:
    client.put("a/x.bin", b"hello")
    cloud_emulator.configure(latency_s=0.15)
    for headers in ({}, {"method": "HEAD"}, {"Range": "bytes=1-2"}):
        t0 = time.perf_counter()
        status, _, body = client.get("a/x.bin", dict(headers))
        assert time.perf_counter() - t0 >= 0.15, headers
        assert status in (200, 206)
    assert body == b"el"


def test_one_connection_is_capped_at_its_bandwidth(
    client: Client, cloud_emulator: CloudEmulator
) -> None:
    data = os.urandom(9 * MB)
    client.put("a/big.bin", data)
    assert client.get("a/big.bin")[2] == data  # fills the mirror
    cloud_emulator.configure(latency_s=0.0)  # default 90 MB/s per connection
    t0 = time.perf_counter()
    status, headers, body = client.get("a/big.bin")
    # 9 MB at 90 MB/s: 100 ms, less the one chunk that may go unpaced at the end.
    assert time.perf_counter() - t0 >= 0.09
    assert (status, body, headers["ETag"]) == (
        200,
        data,
        client.s3.head_object(Bucket=client.bucket, Key="a/big.bin")["ETag"],
    )
    t0 = time.perf_counter()
    status, headers, body = client.get("a/big.bin", {"Range": f"bytes={MB}-{5 * MB - 1}"})
    assert time.perf_counter() - t0 >= 4 * MB / (90 * MB) - 512 * KiB / (90 * MB)
    assert (status, body, headers["Content-Range"]) == (
        206,
        data[MB : 5 * MB],
        f"bytes {MB}-{5 * MB - 1}/{9 * MB}",
    )


def test_each_connection_gets_its_own_bandwidth(
    s3_bucket: S3Bucket, cloud_emulator: CloudEmulator
) -> None:
    clients = [Client(s3_bucket, cloud_emulator) for _ in range(4)]
    data = os.urandom(1 * MB)
    clients[0].put("a/one.bin", data)
    for c in clients:  # open the four connections and fill the mirror
        assert c.get("a/one.bin")[2] == data
    cloud_emulator.configure(latency_s=0.0, conn_bytes_per_s=2 * MB, chunk_bytes=64 * KiB)
    cloud_emulator.reset()
    start = threading.Barrier(len(clients))
    took: list[float] = []

    def read(c: Client) -> None:
        start.wait()
        t0 = time.perf_counter()
        assert c.get("a/one.bin")[2] == data
        took.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=read, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each body is paced at 2 MB/s (>= ~0.47 s for 1 MB) ...
    assert len(took) == 4 and min(took) >= 0.45, took
    # ... and the four ran side by side: one 2 MB/s link shared by all would need >= 2 s.
    log = cloud_emulator.log()
    window = max(e["t1"] for e in log) - min(e["t0"] for e in log)
    assert len(log) == 4 and window < 1.5, log
    stats = cloud_emulator.stats()
    assert stats["peak_in_flight"] == 4 and stats["body_bytes"] == 4 * MB
    use = offered(stats, cloud_emulator.settings)
    assert use["offered_MBps"] == 8.0 and 0 < use["link_share"] <= 1.01


def test_a_prefix_over_its_request_rate_gets_503_slowdown(
    client: Client, cloud_emulator: CloudEmulator
) -> None:
    client.put("hot/x.bin", b"x")
    client.put("cold/y.bin", b"y")
    cloud_emulator.configure(latency_s=0.0, get_rate=5.0, rate_burst_s=1.0, retry_after_s=1)
    cloud_emulator.reset()
    seen: list[int] = []
    t0 = time.perf_counter()
    for _ in range(30):
        status, headers, body = client.get("hot/x.bin")
        seen.append(status)
        if status == 503:
            assert b"<Code>SlowDown</Code>" in body and headers["Retry-After"] == "1"
        else:
            assert (status, body) == (200, b"x")
    elapsed = time.perf_counter() - t0
    ok = seen.count(200)
    assert seen.count(503) >= 1 and ok >= 5
    assert ok <= 5 + 5 * elapsed + 1  # the bucket's 5 plus what refilled meanwhile
    assert client.get("cold/y.bin")[:1] == (200,)  # another prefix has its own limit
    stats = cloud_emulator.stats()
    assert stats["throttled"] == stats["status_503"] == seen.count(503)
    assert stats["by_prefix"][f"{client.bucket}/hot"] == 30
    assert stats["by_prefix"][f"{client.bucket}/cold"] == 1


def test_counters_add_up(
    client: Client, s3_bucket: S3Bucket, cloud_emulator: CloudEmulator
) -> None:
    blobs = {f"c/{i}.bin": os.urandom(100 * KiB + i) for i in range(3)}
    for key, blob in blobs.items():
        client.put(key, blob)
    cloud_emulator.configure(latency_s=0.0)
    cloud_emulator.reset()
    others = [Client(s3_bucket, cloud_emulator) for _ in range(2)]
    received = 0
    for c in (client, *others):
        for key, blob in blobs.items():
            body = c.get(key, {"Range": "bytes=10-"})[2]
            assert body == blob[10:]
            received += len(body)
    assert client.get("c/0.bin", {"method": "HEAD"})[0] == 200
    stats = cloud_emulator.stats()
    assert stats["body_bytes"] == received
    assert (stats["requests"], stats["gets"], stats["heads"]) == (10, 9, 1)
    assert stats["peak_connections"] >= 3 and stats["open_connections"] >= 3
    assert stats["mirror_fills"] == 3
    cloud_emulator.reset()
    assert cloud_emulator.stats()["body_bytes"] == 0


def test_objects_behave_like_moto_through_the_mirror(
    client: Client, cloud_emulator: CloudEmulator
) -> None:
    client.put("m/k.bin", b"0123456789")
    assert client.get("m/k.bin", {"Range": "bytes=-3"})[2] == b"789"
    assert client.get("m/k.bin", {"Range": "bytes=4-"})[2] == b"456789"
    status, _, body = client.get("m/k.bin", {"Range": "bytes=20-30"})
    assert status == 416 and b"InvalidRange" in body
    # A range covering the whole object is still a 206 with Content-Range (S3 and moto):
    # object_store (LitData's obstore client) refuses a 200 to a ranged GET.
    for whole in ("bytes=0-9", "bytes=0-", "bytes=0-99", "bytes=-10"):
        status, headers, body = client.get("m/k.bin", {"Range": whole})
        assert (status, headers["Content-Range"], body) == (206, "bytes 0-9/10", b"0123456789")
    for ignored in ("bytes=5-3", "bytes=0-1,4-5", "lines=0-1"):  # S3 and moto: a plain 200
        status, headers, body = client.get("m/k.bin", {"Range": ignored})
        assert (status, headers["Content-Range"], body) == (200, None, b"0123456789")
    client.put("m/k.bin", b"replaced")  # a new version: the mirror must not serve the old one
    assert client.get("m/k.bin")[2] == b"replaced"
    status, _, body = client.get("m/k.bin", {"If-Match": '"not-the-etag"'})
    assert status == 412
    status, _, body = client.get("m/missing.bin")
    assert status == 404 and b"NoSuchKey" in body


def _stores(
    bucket: S3Bucket, emulator: CloudEmulator, prefix: str, *, max_connections: int, retries: int
) -> tuple[S3Store, HTTPStore]:
    """(an S3 store through the emulator, a presigned-URL store over the same objects),
    retrying quickly."""
    opts = StorageOptions(
        endpoint_url=emulator.endpoint_url,
        part_size=256 * KiB,
        max_connections=max_connections,
        retries=retries,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    store = S3Store(bucket.name, prefix, opts)
    presigned = HTTPStore(lambda keys: {k: store.presign_get(k, 600) for k in keys}, options=opts)
    return store, presigned


def test_boto3_and_presigned_clients_survive_the_faults(
    s3_bucket: S3Bucket, cloud_emulator: CloudEmulator, tmp_path: Path
) -> None:
    store, presigned = _stores(s3_bucket, cloud_emulator, "f", max_connections=4, retries=12)
    data = os.urandom(2 * MiB + 7)
    store.write_bytes("s.bin", data)  # PUT through the emulator
    hashes = {"xxh3_64": hash_bytes("xxh3_64", data)}
    cloud_emulator.configure(faults={"error_rate": 0.2, "cut_rate": 0.3}, slowdown_rate=0.05)
    store.download("s.bin", tmp_path / "a.bin", expected_size=len(data), expected_hashes=hashes)
    presigned.download("s.bin", tmp_path / "b.bin", expected_size=len(data), expected_hashes=hashes)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes() == data
    stats = cloud_emulator.stats()
    assert stats["errors"] >= 1 and stats["cuts"] >= 1, stats
    cloud_emulator.configure(faults={"corrupt_rate": 1.0, "cut_rate": 0.0, "error_rate": 0.0})
    with pytest.raises(HashMismatchError):
        store.download("s.bin", tmp_path / "c.bin", expected_size=len(data), expected_hashes=hashes)
    assert cloud_emulator.stats()["corrupted"] >= 1


def test_injected_slowdown_and_stalls(client: Client, cloud_emulator: CloudEmulator) -> None:
    client.put("s/x.bin", b"abc" * 1000)
    cloud_emulator.configure(slowdown_rate=1.0)
    status, headers, body = client.get("s/x.bin")
    assert status == 503 and b"SlowDown" in body and "Retry-After" not in headers
    cloud_emulator.configure(
        slowdown_rate=0.0, latency_s=0.0, faults={"stall_rate": 1.0, "stall_s": 0.3}
    )
    t0 = time.perf_counter()
    assert client.get("s/x.bin")[2] == b"abc" * 1000
    assert time.perf_counter() - t0 >= 0.3
    stats = cloud_emulator.stats()
    assert (stats["injected_slowdowns"], stats["stalls"]) == (1, 1)


def test_ranged_reads_keep_their_connection_and_survive_cuts(
    s3_bucket: S3Bucket, cloud_emulator: CloudEmulator, tmp_path: Path
) -> None:
    """S3 ranged reads land straight in their buffer (``_direct_reader``): a body read to
    its end hands the connection back for the next request, a cut one is dropped and the
    read resumes where it stopped, with the same bytes."""
    store, presigned = _stores(s3_bucket, cloud_emulator, "direct", max_connections=1, retries=20)
    data = os.urandom(3 * MiB + 11)
    store.write_bytes("d.bin", data)
    body = store._get_range("d.bin", 0, 9, None)  # the installed botocore allows it
    assert body.readinto is not None
    body.close()
    cloud_emulator.configure(latency_s=0.0)
    cloud_emulator.reset()
    spans = [(i * 300 * KiB, min((i + 1) * 300 * KiB + 5, len(data))) for i in range(11)]
    for start, end in spans:
        assert store.read_range("d.bin", start, end) == data[start:end]
    stats = cloud_emulator.stats()
    # One connection serves them all (the second is the PUT's, replaced after it).
    assert stats["requests"] == len(spans) and stats["connections"] <= 2, stats

    # Presigned URLs (httpx) keep theirs too: each body is read to its end.
    presigned.read_range("d.bin", 0, 1)
    cloud_emulator.reset()
    for start, end in spans:
        assert presigned.read_range("d.bin", start, end) == data[start:end]
    stats = cloud_emulator.stats()
    assert stats["requests"] == len(spans) and stats["connections"] <= 1, stats
    # And so does a whole download in parts (13 parts of 256 KiB, one at a time).
    cloud_emulator.reset()
    presigned.download("d.bin", tmp_path / "d.bin", expected_size=len(data))
    assert (tmp_path / "d.bin").read_bytes() == data
    stats = cloud_emulator.stats()
    assert stats["requests"] == 13 and stats["connections"] <= 1, stats

    cloud_emulator.configure(faults={"cut_rate": 0.5})
    for reader in (store, presigned):
        cloud_emulator.reset()
        for start, end in spans:
            assert reader.read_range("d.bin", start, end) == data[start:end]
        stats = cloud_emulator.stats()
        assert stats["cuts"] >= 2, stats
        assert stats["connections"] >= stats["cuts"]  # a cut connection is never reused


def test_without_keep_alive_every_request_pays_a_new_connection(
    s3_bucket: S3Bucket, cloud_emulator: CloudEmulator
) -> None:
    """``keep_alive=False`` answers with ``Connection: close``: the next request opens a new
    connection, which waits ``handshake_s`` before its first answer (with keep-alive, only
    the first request pays it)."""
    store, _ = _stores(s3_bucket, cloud_emulator, "reuse", max_connections=1, retries=3)
    data = os.urandom(64 * KiB)
    store.write_bytes("r.bin", data)
    cloud_emulator.configure(latency_s=0.0, handshake_s=0.1, keep_alive=False)
    cloud_emulator.reset()
    t0 = time.perf_counter()
    for i in range(4):
        assert store.read_range("r.bin", i, i + 10) == data[i : i + 10]
    assert time.perf_counter() - t0 >= 0.4  # a handshake each
    stats = cloud_emulator.stats()  # asked on a connection of its own, counted too
    assert stats["requests"] == 4 and stats["connections"] - 1 == 4, stats
    cloud_emulator.configure(keep_alive=True)
    store.read_range("r.bin", 0, 1)  # a connection that stays
    cloud_emulator.reset()
    for i in range(4):
        assert store.read_range("r.bin", i, i + 10) == data[i : i + 10]
    stats = cloud_emulator.stats()
    assert stats["requests"] == 4 and stats["connections"] - 1 == 0, stats
