"""Cacheless reads share what the node fetched: processes find each other's memory files,
wait for each other's fetch of the same blocks (node-wide block claims), and copy verified
blocks instead of fetching them again; a dead or stopped peer never holds a reader up."""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from shardstream.client import PlanOptions, ReadOptions, ShardstreamLoader, StreamingDataset
from shardstream.client.cache.keys import key_to_name
from shardstream.client.reads.peer_files import BlockClaims, MemoryPeers
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.ranged_shards import (
    N,
    through_emulator,
    tokens_of,
    upload_folder,
    write_ranged_shards,
)
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

_NAMES: list[str] = []  # the node names of the last dataset read


def _read_ids(url: str, workers: int) -> list[int]:
    read = ReadOptions(memory_only=True, memory_budget_bytes=64 << 20)
    ds = StreamingDataset(url, 8, read=read, plan=PlanOptions(seed=5))
    _NAMES[:] = [
        key_to_name(s.cache_key(i)) for s in ds.stream.sources for i in range(len(s.shards))
    ]
    ids: list[int] = []
    with ShardstreamLoader(ds, num_workers=workers) as loader:
        for batch in loader:
            for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
                assert row.numpy().tolist() == tokens_of(i).tolist()
            ids += batch["id"].tolist()
    ds.stream.close()
    return ids


def test_two_workers_fetch_the_dataset_about_once(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_ranged_shards(tmp_path / "ds")
    total = upload_folder(tmp_path / "ds", f"{s3_bucket.url}/shared")
    url = f"{s3_bucket.url}/shared/index.json"
    through_emulator(cloud_emulator, monkeypatch)
    alone = _read_ids(url, 0)
    assert sorted(alone) == list(range(N))
    cloud_emulator.reset()
    both = _read_ids(url, 2)
    served = cloud_emulator.stats()["body_bytes"]
    assert both == alone  # the same sequence, whoever fetched the bytes
    # Without sharing each worker fetches every block it uses: about 2x the dataset.
    assert served <= 1.2 * total, (served, total)
    left = [p for n in _NAMES for p in MemoryPeers().root.glob(f"{glob.escape(n)}.*")]
    assert not left  # links and claims withdrawn


def _hold(path: Path, ready: mp.synchronize.Event, seconds: float) -> None:
    with BlockClaims(path).hold(2, 5):
        ready.set()
        time.sleep(seconds)


def test_a_claim_is_waited_for_until_released_or_its_holder_dies(tmp_path: Path) -> None:
    claims = tmp_path / "shard.claims"
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(claims, ready, 0.5))
    holder.start()
    assert ready.wait(10)
    began = time.monotonic()
    with BlockClaims(claims).hold(6, 9):  # other blocks: no wait
        assert time.monotonic() - began < 0.2
    with BlockClaims(claims).hold(4, 4):  # overlaps: waits for the holder's release
        waited = time.monotonic() - began
    holder.join()
    assert 0.3 < waited < 5
    # A holder killed mid-fetch frees its claim at once (the kernel drops its locks).
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(claims, ready, 60))
    holder.start()
    assert ready.wait(10)
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join()
    began = time.monotonic()
    with BlockClaims(claims).hold(2, 5):
        assert time.monotonic() - began < 1
    # A stopped holder costs at most the wait bound, never a hang.
    ready = ctx.Event()
    holder = ctx.Process(target=_hold, args=(claims, ready, 60))
    holder.start()
    assert ready.wait(10)
    os.kill(holder.pid or 0, signal.SIGSTOP)
    began = time.monotonic()
    with BlockClaims(claims).hold(3, 3, wait_s=0.5):
        assert 0.4 < time.monotonic() - began < 3
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join()


def test_links_of_dead_processes_are_removed(tmp_path: Path) -> None:
    peers = MemoryPeers(tmp_path)
    fd = os.memfd_create("mine", os.MFD_CLOEXEC)
    mine = peers.register("v1-abc/shard.00000.mds", fd)
    ctx = mp.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(60,))
    child.start()
    dead = tmp_path / f"{mine.name.rpartition('.')[0]}.{child.pid}"
    os.symlink(f"/proc/{child.pid}/fd/0", dead)
    assert peers.others("v1-abc/shard.00000.mds") == [dead]  # alive: a peer
    os.kill(child.pid or 0, signal.SIGKILL)
    child.join()
    assert peers.others("v1-abc/shard.00000.mds") == []  # not ours, and gone
    assert not dead.is_symlink()
    peers.withdraw("v1-abc/shard.00000.mds", mine)
    assert not any(tmp_path.iterdir())
    os.close(fd)


def test_a_folder_others_can_write_is_not_used(tmp_path: Path) -> None:
    open_to_all = tmp_path / "peers"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    peers = MemoryPeers(open_to_all)
    assert not peers.shared
    fd = os.memfd_create("mine", os.MFD_CLOEXEC)
    assert peers.register("v1-abc/shard.00000.mds", fd) is None
    assert peers.others("v1-abc/shard.00000.mds") == []
    assert peers.claims("v1-abc/shard.00000.mds") is None
    assert not any(open_to_all.iterdir())
    os.close(fd)
    assert MemoryPeers(tmp_path / "mine").shared  # a fresh private folder is


def test_a_peer_serves_the_blocks_it_holds_and_only_those(tmp_path: Path) -> None:
    """Block by block: a peer holding block 1 of 0..2 serves it; its hole (block 0) and a
    block with one flipped byte (block 2) are not taken, so only they are fetched."""
    from shardstream.client.reads.block_sources import read_peer_blocks
    from shardstream.client.reads.io import BlockStats

    shard, data = _small_shard(tmp_path / "ds")
    peer = bytearray(len(data))  # a peer's memory file: holes where it fetched nothing
    peer[4096:8192] = data[4096:8192]
    peer[8192:12288] = data[8192:12288]
    peer[9000] ^= 0xFF
    (tmp_path / "peer").write_bytes(bytes(peer))
    stats = BlockStats()
    found = read_peer_blocks([tmp_path / "peer"], shard, [0, 1, 2], 4096, stats=stats)
    assert list(found) == [1] and found[1] == data[4096:8192]
    assert stats.peer_bytes == 4096
    (tmp_path / "good").write_bytes(data)  # a second peer with every block
    found = read_peer_blocks(
        [tmp_path / "peer", tmp_path / "good"], shard, [0, 1, 2], 4096, stats=stats
    )
    assert sorted(found) == [0, 1, 2] and b"".join(found[b] for b in (0, 1, 2)) == data[:12288]


def test_blocks_a_shared_download_file_holds_are_used_in_place(tmp_path: Path) -> None:
    """The node cache's download file, written by several processes: the blocks it holds
    verified are found where they lie (a hole and a block with a flipped byte are not),
    and nothing is copied out of it."""
    from shardstream.client.reads.block_sources import blocks_in_place
    from shardstream.client.reads.io import BlockStats

    shard, data = _small_shard(tmp_path / "ds")
    shared = bytearray(len(data))  # full size, holes where nobody wrote yet
    shared[4096:12288] = data[4096:12288]
    shared[9000] ^= 0xFF  # block 2 half written
    shared[-100:] = data[-100:]  # part of the last block only
    path = tmp_path / "download"
    path.write_bytes(bytes(shared))
    stats = BlockStats()
    last = -(-len(data) // 4096) - 1

    def found() -> list[int]:
        fd = os.open(path, os.O_RDONLY)
        try:
            return blocks_in_place(fd, shard, [0, 1, 2, last], 4096, stats=stats)
        finally:
            os.close(fd)

    assert found() == [1]
    assert stats.peer_bytes == 4096
    path.write_bytes(data)  # every block written
    assert found() == [0, 1, 2, last]


def _small_shard(out: Path) -> tuple[Any, bytes]:
    """A one-shard dataset of 16 samples in 4 KiB blocks at ``out``: its index entry and bytes."""
    import numpy as np

    from shardstream.mds import MDSWriter, load_index

    with MDSWriter(out, {"tokens": "ndarray:uint16:2048"}, block_size=4096) as writer:
        for i in range(16):
            writer.write({"tokens": np.full(2048, i, np.uint16)})
    shard = load_index(out / "index.json").shards[0]
    return shard, (out / shard.raw_data.basename).read_bytes()
