"""A pass that is abandoned, or a reader that is dropped, gives back its descriptors.

A training loop that breaks out of an epoch, or lets a dataset go, must not leave the
read path's threads running: idle, they kept the path alive for the rest of the process,
with its memory files (``memfd``), its leased cache files and the store's connections
(a test session once ended >100 descriptors up this way). Here a pass over S3 (moto) is
abandoned after a few batches, in the cache and the cacheless mode, through the dataset,
the in-process loader, and the bare batch stream (never closed: the read path's
finalizer closes it); the process's descriptors then return to their count before.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardstream.client import (
    CacheOptions,
    PlanOptions,
    ReadOptions,
    ShardstreamLoader,
    StreamingDataset,
)
from tests.fixtures.fd_guard import open_fds
from tests.fixtures.ranged_shards import upload_folder, write_ranged_shards
from tests.fixtures.s3 import S3Bucket


@pytest.fixture
def url(s3_bucket: S3Bucket, tmp_path: Path) -> str:
    write_ranged_shards(tmp_path / "ds")
    upload_folder(tmp_path / "ds", f"{s3_bucket.url}/abandoned")
    return f"{s3_bucket.url}/abandoned/index.json"


def _held() -> Counter[str]:
    """What a read path holds: its memory files, its cache files, its threads."""
    held = Counter(
        "memfd" if "memfd:shardstream" in target else "mds"
        for target in open_fds().values()
        if "memfd:shardstream" in target or target.endswith(".mds")
    )
    held["threads"] = sum(t.name.startswith("shardstream-range") for t in threading.enumerate())
    return +held


def _settled(want: int, timeout_s: float = 10.0) -> int:
    """The descriptor count once it is at most ``want`` (the server's ends of closed
    connections close on its own threads), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        count = len(open_fds())
        if count <= want or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.mark.parametrize("via", ["dataset", "loader", "stream"])
@pytest.mark.parametrize("cacheless", [False, True], ids=["cache", "cacheless"])
def test_an_abandoned_pass_gives_its_descriptors_back(
    url: str, tmp_path: Path, cacheless: bool, via: str
) -> None:
    before = _settled(0, timeout_s=1.0)  # after the fixture's own connections closed
    ds = StreamingDataset(
        url,
        8,
        cache=CacheOptions(dir=tmp_path / "cache"),
        read=ReadOptions(memory_only=cacheless),
        plan=PlanOptions(seed=3),
    )
    it: Iterator[Any]
    if via == "dataset":
        it = iter(ds)
    elif via == "loader":
        it = iter(ShardstreamLoader(ds, num_workers=0))
    else:
        it = ds.stream.batches(0, 0)
    for _ in range(3):
        next(it)
    held = _held()
    assert held["threads"] > 0 and held["memfd" if cacheless else "mds"] > 0, held
    del it  # the loop broke out of the epoch
    if via != "stream":  # closed by the pass itself: its threads at once
        assert not _held()["threads"], _held()
        gc.collect()  # a partial shard and its header refer to each other
        assert not _held(), _held()
    del ds  # and the dataset goes: its store's connections too
    assert _settled(before) <= before, Counter(open_fds().values())
    deadline = time.monotonic() + 10
    while _held() and time.monotonic() < deadline:  # the finalizer closes on a thread
        time.sleep(0.05)
    assert not _held(), _held()
