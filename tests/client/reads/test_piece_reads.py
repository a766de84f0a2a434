"""Piece reads: a cold first batch reads the 64 KiB pieces of its samples, not whole blocks.

The shards carry a piece table in their header (``shardstream.mds._pieces``). Through the
cloud emulator in front of moto: the first batch arrives after fetching a few pieces per
sample (far less than its blocks), every later batch is read by block as before, the sample
sequence is the same with piece reads on and off (cache and cacheless), a corrupted piece is
caught by its digest and fetched again, and MosaicML's reader still reads such shards.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.client import CacheOptions, PlanOptions, ReadOptions, StreamingDataset
from shardstream.client.distributed import Topology
from shardstream.client.reads.io import read_verified
from shardstream.errors import CorruptShardError, FormatError
from shardstream.mds import MDSIndex, MDSWriter, PieceTable, load_index, write_shard_arrays
from shardstream.mds._index import index_from_json
from shardstream.storage import open_store
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.s3 import S3Bucket

__all__ = ["_cloud_emulator_process", "cloud_emulator"]

N = 4000
TOKENS = 256  # 512-byte token rows + an 8-byte id: ~8 samples per 4 KiB piece
BLOCK = 256 << 10
PIECE = 4 << 10
BATCH = 8


def tokens_of(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(TOKENS, dtype=np.int64) * 5 + i * 11).astype(np.uint16)


def _write(out: Path, *, variable: bool = False) -> None:
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    if variable:
        columns = {"id": "int", "tokens": "ndarray:uint16"}
    with MDSWriter(out, columns, size_limit=1 << 20, block_size=BLOCK, piece_size=PIECE) as writer:
        for i in range(N):
            toks = tokens_of(i)
            writer.write({"id": i, "tokens": toks[: 64 + i % 192] if variable else toks})


def _upload(folder: Path, url: str) -> None:
    store = open_store(url)
    for path in sorted(folder.iterdir()):
        store.upload(path, path.name)


@pytest.fixture(params=["fixed", "variable"])
def dataset(request: pytest.FixtureRequest, s3_bucket: S3Bucket, tmp_path: Path) -> str:
    _write(tmp_path / "ds", variable=request.param == "variable")
    _upload(tmp_path / "ds", f"{s3_bucket.url}/pieces")
    return f"{s3_bucket.url}/pieces/index.json"


def _open(
    url: str, cache: CacheOptions | None = None, read: ReadOptions | None = None
) -> StreamingDataset:
    return StreamingDataset(url, BATCH, cache=cache, read=read, plan=PlanOptions(seed=5))


def _ids(ds: StreamingDataset) -> list[int]:
    ids: list[int] = []
    for batch in ds:
        for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
            assert row.numpy().tolist() == tokens_of(i)[: len(row)].tolist()
        ids += batch["id"].tolist()
    return ids


@pytest.mark.parametrize("memory_only", [True, False], ids=["cacheless", "cache"])
def test_first_batch_reads_pieces_and_the_sequence_is_unchanged(
    dataset: str,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    memory_only: bool,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)

    def options(name: str, **kw: Any) -> tuple[CacheOptions, ReadOptions]:
        return CacheOptions(dir=tmp_path / name), ReadOptions(memory_only=memory_only, **kw)

    # Every block read waits until the first batch is out (or 20 s): a first batch that
    # needed any block would arrive only after a block read gave up waiting.
    gate, late = threading.Event(), []
    real = read_verified

    def gated(*args: Any, **kwargs: Any) -> bytes:
        if not gate.wait(20):
            late.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr("shardstream.client.reads.block_sources.read_verified", gated)
    ds = _open(dataset, *options("first"))
    batches = iter(ds)  # kept: closing it waits for the reads in flight
    first = next(batches)
    gate.set()
    del batches
    ds.stream.close()
    assert len(first["id"]) == BATCH and not late
    monkeypatch.setattr("shardstream.client.reads.block_sources.read_verified", real)

    by_piece = _ids(_open(dataset, *options("on")))
    by_block = _ids(_open(dataset, *options("off", piece_read_batches=0)))
    assert by_piece == by_block and sorted(by_piece) == list(range(N))


def test_a_corrupt_piece_is_caught_and_fetched_again(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _write(tmp_path / "ds")
    _upload(tmp_path / "ds", f"{s3_bucket.url}/c")
    url = f"{s3_bucket.url}/c/index.json"
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    cloud_emulator.configure(latency_s=0.0)
    # The store flips one bit of the first piece read (a short range past the header), as a
    # bad disk or proxy would; the emulator's own corruption hits whichever read comes next.
    store_type = type(open_store(f"{s3_bucket.url}/c"))
    real = store_type.read_range
    flipped: list[int] = []

    def flaky(self: Any, key: str, start: int, end: int, **kwargs: Any) -> bytes:
        data = real(self, key, start, end, **kwargs)
        if not flipped and start > 0 and end - start <= 2 * PIECE:
            flipped.append(start)
            return bytes([data[0] ^ 1]) + data[1:]
        return data

    monkeypatch.setattr(store_type, "read_range", flaky)
    ids = _ids(_open(url, read=ReadOptions(memory_only=True, piece_read_batches=1 << 20)))
    assert sorted(ids) == list(range(N)) and len(flipped) == 1
    assert any("piece" in r.getMessage() and "corrupt" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(store_type, "read_range", real)
    assert ids == _ids(_open(url, read=ReadOptions(memory_only=True, piece_read_batches=0)))


def test_piece_table_is_checked_against_the_index(tmp_path: Path) -> None:
    _write(tmp_path / "ds")
    index = load_index(tmp_path / "ds" / "index.json")
    shard = index.shards[0]
    spec = shard.piece_spec
    assert spec is not None and spec.piece_size == PIECE
    data = bytearray((tmp_path / "ds" / shard.raw_data.basename).read_bytes())
    table = PieceTable(spec, bytes(data[: spec.data_start]), len(data), "s")
    table.verify(3, data[slice(*table.span(3, 5))])
    with pytest.raises(CorruptShardError, match="piece 4"):
        bad = bytearray(data[slice(*table.span(3, 5))])
        bad[PIECE + 7] ^= 1
        table.verify(3, bad)
    lo, _ = spec.table_span
    data[lo] ^= 1
    with pytest.raises(CorruptShardError, match="piece table"):
        PieceTable(spec, bytes(data[: spec.data_start]), len(data), "s")
    # A pieces entry without a header digest, or with a malformed value, is refused by name.
    obj = json.loads((tmp_path / "ds" / "index.json").read_text())
    hashes = obj["shards"][0]["raw_data"]["hashes"]
    key = next(k for k in hashes if k.startswith("pieces:"))
    hashes[key] = "xyz"
    with pytest.raises(FormatError, match="16 lowercase hex"):
        index_from_json(obj)
    hashes[key] = spec.digest
    for k in [k for k in hashes if k.startswith("header:")]:
        del hashes[k]
    with pytest.raises(FormatError, match="header digest"):
        index_from_json(obj)


def test_mosaicml_reads_shards_with_a_piece_table(tmp_path: Path) -> None:
    from streaming import StreamingDataset as MosaicDataset

    _write(tmp_path / "ds", variable=True)
    ds = MosaicDataset(
        local=str(tmp_path / "ds"), shuffle=False, batch_size=1, validate_hash="sha1"
    )
    assert len(ds) == N
    for i in (0, 1, N // 2, N - 1):
        assert ds[i]["id"] == i
        assert ds[i]["tokens"].tolist() == tokens_of(i)[: 64 + i % 192].tolist()


def test_ranks_read_the_few_samples_of_their_neighbours_shards_by_piece(
    s3_bucket: S3Bucket,
    tmp_path: Path,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 shards of 151 samples of 4 KiB, in blocks of 64 KiB (16 samples). 4 ranks of batch 8
    # drop a 16-sample tail, so each partition ends a few samples inside a neighbour's
    # shard. Those few samples touch about half of its blocks, so by block the rank fills
    # the shard whole (as its neighbour does); by piece it reads just them.
    tokens = 2048 - 4
    columns = {"id": "int32", "tokens": f"ndarray:uint16:{tokens}"}

    def publish(name: str, piece_size: int | None) -> tuple[str, int]:
        folder = tmp_path / name
        shards = []
        for k in range(16):
            ids = np.arange(k * 151, (k + 1) * 151, dtype=np.int32)
            rows = np.repeat(ids[:, None], tokens, axis=1).astype(np.uint16)
            shards.append(
                write_shard_arrays(
                    folder,
                    f"shard.{k:05d}.mds",
                    columns,
                    {"id": ids, "tokens": rows},
                    block_size=64 << 10,
                    piece_size=piece_size,
                )
            )
        MDSIndex(shards=shards).write(folder / "index.json")
        _upload(folder, f"{s3_bucket.url}/{name}")
        data = sum(s.raw_data.bytes for s in shards)
        return f"{s3_bucket.url}/{name}/index.json", data + 4 * len(
            (folder / "index.json").read_bytes()
        )

    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    served = {}
    for name, piece_size in [("pieces", 4096), ("blocks", None)]:
        url, total = publish(name, piece_size)
        cloud_emulator.reset()
        seen: list[int] = []
        for rank in range(4):
            ds = StreamingDataset(
                url,
                8,
                # Boundary shards only: no first batches read by piece (on 600 samples
                # per rank, their pieces would be a few percent more).
                cache=CacheOptions(dir=tmp_path / f"{name}-node{rank}"),
                read=ReadOptions(piece_read_batches=0),
                plan=PlanOptions(seed=3),
                topology=Topology(rank=rank, world_size=4),
            )
            for batch in ds:
                assert batch["tokens"][:, 0].tolist() == batch["id"].tolist()
                seen += batch["id"].tolist()
            ds.stream.close(finish_fills_s=30)
        assert len(seen) == len(set(seen)) == 16 * 151 - 16
        served[name] = cloud_emulator.stats()["body_bytes"] / total
    # By piece: the boundary samples' pieces (24 samples, two 4 KiB pieces each: ~2 % here).
    assert served["pieces"] <= 1.04, served
    assert served["blocks"] >= 1.1, served  # the boundary shards filled twice
