"""A whole-shard download whose bytes fail the published hash is fetched again (at most
``REFETCH_ATTEMPTS`` downloads), and only then fails with one error naming the shard: through
moto's S3 server behind a proxy that flips a byte in GET bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream.client import CacheOptions, PlanOptions, ReadOptions, StreamingDataset
from shardstream.client.reads.refetch import REFETCH_ATTEMPTS, refetched
from shardstream.errors import HashMismatchError
from shardstream.mds import MDSWriter
from shardstream.retry import RetryPolicy
from tests.fixtures.faulty_proxy import Faults, FaultyProxy, faulty_proxy
from tests.fixtures.ranged_shards import TOKENS, tokens_of, upload_folder
from tests.fixtures.s3 import S3Bucket

__all__ = ["faulty_proxy"]

N = 320  # whole batches of 8


def _dataset(s3_bucket: S3Bucket, tmp_path: Path, compression: str | None) -> str:
    """One shard: every corrupted body is a download of the same shard."""
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(tmp_path / "ds", columns, compression=compression) as writer:
        for i in range(N):
            writer.write({"id": i, "tokens": tokens_of(i)})
    assert len(list((tmp_path / "ds").glob("*.mds*"))) == 1
    upload_folder(tmp_path / "ds", f"{s3_bucket.url}/whole")
    return f"{s3_bucket.url}/whole/index.json"


def read_ids(
    url: str, options: tuple[CacheOptions, ReadOptions], proxy: FaultyProxy, faults: Faults
) -> list[int]:
    cache, read = options
    ds = StreamingDataset(url, 8, cache=cache, read=read, plan=PlanOptions(seed=3))
    proxy.faults = faults  # after the index was read (it has no digest to check)
    ids: list[int] = []
    try:
        for batch in ds:
            for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
                assert row.numpy().tolist() == tokens_of(i).tolist()
            ids += batch["id"].tolist()
    finally:
        ds.stream.close()
    return ids


def _shard_gets(proxy: FaultyProxy) -> int:
    proxy.settle()
    return sum(1 for e in proxy.log if ".mds" in e.path.split("?")[0])


@pytest.mark.parametrize(
    ("cache", "compression"),
    [
        ("cache", None),  # the node cache, whole downloads
        ("cache", "zstd"),  # the packed copy is what is fetched again
        ("memory", "zstd"),  # cacheless: a zstd shard is one whole read into memory
    ],
)
def test_a_corrupted_whole_download_is_fetched_again(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    faulty_proxy: FaultyProxy,
    monkeypatch: pytest.MonkeyPatch,
    cache: str,
    compression: str | None,
) -> None:
    url = _dataset(s3_bucket, tmp_path, compression)
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.endpoint_url)
    options = (
        (CacheOptions(dir=tmp_path / "cache"), ReadOptions(ranged_reads=False))
        if cache == "cache"
        else (CacheOptions(), ReadOptions(memory_only=True, memory_budget_bytes=64 << 20))
    )
    # Every download but the last allowed is corrupted.
    faults = Faults(corrupt_rate=1.0, corrupt_max=REFETCH_ATTEMPTS - 1)
    ids = read_ids(url, options, faulty_proxy, faults)
    assert sorted(ids) == list(range(N))  # and every row's tokens were checked
    assert faulty_proxy.stats["corrupted"] == REFETCH_ATTEMPTS - 1
    assert _shard_gets(faulty_proxy) == REFETCH_ATTEMPTS


def test_a_shard_wrong_every_time_fails_naming_it_after_the_attempts(
    s3_bucket: S3Bucket, tmp_path: Path, faulty_proxy: FaultyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _dataset(s3_bucket, tmp_path, None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", faulty_proxy.endpoint_url)
    options = (
        CacheOptions(dir=tmp_path / "cache"),
        ReadOptions(ranged_reads=False, download_threads=1),
    )
    with pytest.raises(
        HashMismatchError,
        match=rf"shard shard\.\d+\.mds failed .* all {REFETCH_ATTEMPTS} downloads.*re-upload it\): "
        r"s3://.*/whole/shard\.\d+\.mds: xxh3_64 is",
    ):
        read_ids(url, options, faulty_proxy, Faults(corrupt_rate=1.0))
    assert faulty_proxy.stats["corrupted"] >= REFETCH_ATTEMPTS
    assert list((tmp_path / "cache" / "data").iterdir()) == []  # nothing wrong was cached


def test_refetches_follow_the_retry_policy() -> None:
    """The re-fetch loop is the project's retry policy: its attempts, and its deadline
    (a spent deadline allows no second download)."""
    downloads: list[int] = []

    def corrupt() -> bytes:
        downloads.append(1)
        raise HashMismatchError("bytes differ")

    twice = RetryPolicy(attempts=2, base_s=0.0, cap_s=0.0)
    with pytest.raises(HashMismatchError, match=r"shard s\.mds failed .* all 2 downloads"):
        refetched("s.mds", corrupt, twice)
    assert len(downloads) == 2
    downloads.clear()
    spent = RetryPolicy(attempts=None, base_s=1.0, cap_s=1.0, within_s=0.0)
    with pytest.raises(HashMismatchError, match=r"all 1 downloads"):
        refetched("s.mds", corrupt, spent)
    assert len(downloads) == 1
