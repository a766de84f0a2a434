"""``shardstream register`` gives MosaicML-written shards a fast cold start.

MosaicML's ``MDSWriter`` records no block, header or piece digests, so such shards were
fetched whole before a first batch. Registering them now reads each shard once and records
the digests in the version (the piece table in the index entry: the shard files and their
``index.json`` stay as written). A cold reader's first batch then reads its samples'
pieces: counted by the cloud emulator in front of moto, and every sample is checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from streaming import MDSWriter as MosaicWriter

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, PlanOptions, ServerOptions, StreamingDataset
from shardstream.errors import CorruptShardError
from shardstream.mds import load_index
from shardstream.shard_builder.publish import register_index
from shardstream.storage import open_store
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

N = 8000
TOKENS = 256  # 512-byte rows + an 8-byte id: 4 shards of ~1 MiB
BLOCK, PIECE = 64 << 10, 4 << 10


def tokens_of(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(TOKENS, dtype=np.int64) * 9 + i * 5).astype(np.uint16)


@pytest.fixture
def mosaic_shards(s3_bucket: S3Bucket, tmp_path: Path) -> tuple[str, Path]:
    """Shards written by MosaicML's own writer, uploaded: ``(index URL, local folder)``."""
    out = tmp_path / "mosaic"
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MosaicWriter(out=str(out), columns=columns, size_limit=1 << 20) as writer:
        for i in range(N):
            writer.write({"id": i, "tokens": tokens_of(i)})
    store = open_store(f"{s3_bucket.url}/mosaic")
    for path in sorted(out.iterdir()):
        store.upload(path, path.name)
    return f"{s3_bucket.url}/mosaic/index.json", out


def _check(batch: dict[str, Any]) -> list[int]:
    ids: list[int] = batch["id"].tolist()
    for i, row in zip(ids, batch["tokens"], strict=True):
        assert row.numpy().tolist() == tokens_of(i).tolist()
    return ids


def test_registered_mosaic_shards_start_by_piece(
    mosaic_shards: tuple[str, Path],
    live_server: LiveServer,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    url, local = mosaic_shards
    written = load_index(local / "index.json")
    assert len(written.shards) >= 3 and all(s.header_digest is None for s in written.shards)
    total = sum(s.raw_data.bytes for s in written.shards)
    # The server signs URLs for the emulator, and the client reads through it.
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    cloud_emulator.configure(latency_s=0.002)
    with APIClient(live_server.url, live_server.token) as api:
        cloud_emulator.reset()
        register_index(api, url, "mosaic", block_size=BLOCK, piece_size=PIECE)
        reads = [e for e in cloud_emulator.log() if str(e["path"]).endswith(".mds")]
        assert sum(int(e["sent"]) for e in reads) == total  # each shard read once
        records = list(api.iter_shards("mosaic", 1))
    hashes = records[0].mds["raw_data"]["hashes"]
    assert {k.split(":")[0] for k in hashes} == {"xxh3_64", "blocks", "header", "piecetable"}
    folder = url.rpartition("/")[0]
    assert open_store(folder).read_bytes("index.json") == (local / "index.json").read_bytes()

    cloud_emulator.reset()
    server = ServerOptions(url=live_server.url, token=live_server.token)
    cache = CacheOptions(dir=tmp_path / "cache")
    ds = StreamingDataset("mosaic", 16, server=server, cache=cache, plan=PlanOptions(seed=4))
    batches = iter(ds)
    ids = _check(next(batches))
    first = [e for e in cloud_emulator.log() if str(e["path"]).endswith(".mds")]
    # Headers and pieces: far less than one shard, where it fetched whole shards before.
    # (After the first batch the bulk of a shard follows in long ranges; on a loaded machine
    # some may have started by now: only the piece-sized reads are the first batch's.)
    assert first and all(e["range"] for e in first), first  # ranged: never a whole shard
    pieces = [e for e in first if _range_length(str(e["range"])) <= 4 * PIECE]
    assert pieces and sum(int(e["sent"]) for e in pieces) < total / 10, first
    for batch in batches:
        ids += _check(batch)
    assert sorted(ids) == list(range(N))


def test_a_shard_that_differs_from_its_index_is_not_registered(
    s3_bucket: S3Bucket, live_server: LiveServer, tmp_path: Path
) -> None:
    """A hash the index records is checked against the bytes read for the digests."""
    from shardstream.mds import MDSWriter

    out = tmp_path / "ours"
    with MDSWriter(out, {"id": "int"}, block_size=None, piece_size=None) as writer:
        for i in range(100):
            writer.write({"id": i})
    name = load_index(out / "index.json").shards[0].raw_data.basename
    shard = bytearray((out / name).read_bytes())
    shard[-1] ^= 0xFF
    (out / name).write_bytes(bytes(shard))
    store = open_store(f"{s3_bucket.url}/bad")
    for path in sorted(out.iterdir()):
        store.upload(path, path.name)
    with (
        APIClient(live_server.url, live_server.token) as api,
        pytest.raises(CorruptShardError, match="does not match its index"),
    ):
        register_index(api, f"{s3_bucket.url}/bad/index.json", "bad")


def _range_length(header: str) -> int:
    """Bytes a ``Range: bytes=a-b`` header asks for."""
    start, _, end = header.removeprefix("bytes=").partition("-")
    return int(end) - int(start) + 1
