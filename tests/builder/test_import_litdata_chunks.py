"""LitData chunks read directly (``litdata_chunks``, ``litdata_arrow``): the same items as
LitData's own ``StreamingDataset``, the same shard bytes as the import through it, byte
ranges of an ``s3://`` prefix, and one clear error for a damaged chunk.

The folders are written with ``litdata.optimize`` (LitData starts its workers with spawn:
the writer functions are module-level), in each layout the direct reader takes: items with
leaves of every kind in their bodies, flat dicts of plain values in an Arrow footer, single
values, token chunks; and with ``compression="zstd"``, which is LitData's to read.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from litdata import StreamingDataset, TokensLoader, optimize

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.shard_builder.importers import litdata as litdata_format
from shardstream.shard_builder.importers.litdata_index import (
    NUMPY_CODES,
    TORCH_CODES,
    index_of,
    layout_of,
)
from shardstream.shard_builder.importers.source import SourceUnit
from shardstream.storage import S3Store, open_store
from tests.builder.conftest import dir_bytes
from tests.fixtures.s3 import S3Bucket

SMALL = {"shard_size": 4 * 1024, "allow_small_shards": True, "progress": False}
SEQ_LEN = {"tokens": 24}  # the block size each token folder is read with


def _mixed(i: int) -> dict[str, Any]:
    # No Arrow footer (arrays): every leaf kind in the item bodies.
    return {
        "id": (i - 60) * 10**15,
        "name": f"sämple-{i}-" + "🙂" * (i % 3),
        "score": i / 7 - 3,
        "blob": bytes([i % 256]) * (i % 9),
        "flag": i % 3 == 0,
        "vec": np.arange(i % 5 + 1, dtype=np.int32) * i,
        "mat": np.full((2, i % 3 + 1), i, dtype=np.float32),
        "tvec": torch.arange(i % 4 + 1, dtype=torch.int16),
        "tmat": torch.ones(2, 2, dtype=torch.float64) * i,
    }


def _flat(i: int) -> dict[str, Any]:
    # Plain values only: LitData writes the chunks as Arrow footers.
    return {"id": i, "name": f"item-{i}", "score": i / 3, "blob": bytes([i % 256]) * (i % 40)}


def _ragged(i: int) -> dict[str, Any]:
    # Keys missing from some items (nulls in the footer) and one a later item adds.
    item: dict[str, Any] = {"id": i, "name": f"r{i}"}
    if i % 7 != 3:
        item["score"] = i / 2
    if i % 11 == 5:
        item["note"] = f"n{i}"
    return item


def _value(i: int) -> bytes:
    return bytes([i % 256]) * (i % 13)


def _tokens(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(29 + 7 * i, dtype=np.uint16) * 3 + i).astype(np.uint16)


FOLDERS: dict[str, tuple[Any, int, dict[str, Any]]] = {
    "mixed": (_mixed, 120, {"chunk_bytes": "4KB"}),
    "flat": (_flat, 700, {"chunk_size": 300}),
    "ragged": (_ragged, 60, {"chunk_size": 25}),
    "value": (_value, 90, {"chunk_bytes": "300B"}),
    "tokens": (_tokens, 40, {"chunk_size": 700, "item_loader": TokensLoader()}),
    "zstd": (_flat, 200, {"chunk_size": 80, "compression": "zstd"}),
}
FAST = ["mixed", "flat", "value", "tokens"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("litdata-chunks")
    for name, (fn, count, kwargs) in FOLDERS.items():
        optimize(fn=fn, inputs=list(range(count)), output_dir=str(root / name), num_workers=1,
                 verbose=False, **kwargs)  # fmt: skip
    return root


def _config(source: str, output: Path, name: str, **kwargs: Any) -> ImportConfig:
    return ImportConfig(
        format="litdata", inputs=(source,), output=str(output), seq_len=SEQ_LEN.get(name),
        **SMALL, **kwargs,
    )  # fmt: skip


def _unit(source: str, name: str) -> SourceUnit:
    seq_len = str(SEQ_LEN.get(name, ""))
    (unit,) = litdata_format.plan((source,), seq_len)
    return SourceUnit(unit.path, unit.nbytes, unit.mtime_ns, option=seq_len)


def _litdata_records(folder: Path, name: str) -> list[tuple[str, dict[str, Any]]]:
    """LitData's own items, as records the way the import converted them before."""
    seq_len = SEQ_LEN.get(name, 0)
    if seq_len:
        ds = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=seq_len))
    else:
        ds = StreamingDataset(str(folder), shuffle=False)
    return [litdata_format._record(f"{folder} item {i}", ds[i], seq_len) for i in range(len(ds))]


def _assert_same_records(got: list[Any], want: list[Any]) -> None:
    assert [where for where, _ in got] == [where for where, _ in want]
    for (where, sample), (_, expected) in zip(got, want, strict=True):
        assert list(sample) == list(expected), where
        for column, (encoding, value) in sample.items():
            want_encoding, want_value = expected[column]
            assert encoding == want_encoding, (where, column)
            if isinstance(want_value, np.ndarray):
                assert isinstance(value, np.ndarray), (where, column)
                assert (value.dtype, value.shape) == (want_value.dtype, want_value.shape)
                assert np.array_equal(value, want_value), (where, column)
            else:
                assert type(value) is type(want_value) and value == want_value, (where, column)


@pytest.mark.parametrize("name", [*FAST, "ragged", "zstd"])
def test_items_are_litdata_s_own_field_by_field(folders: Path, name: str) -> None:
    unit = _unit(str(folders / name), name)
    index = index_of(unit)
    # The direct reader takes every layout but the compressed one.
    assert (layout_of(index, SEQ_LEN.get(name, 0)) is None) == (name == "zstd")
    if name != "value":
        assert len(index.names) >= 3  # items (and tokens) in several chunks
    records = list(litdata_format.read(unit))
    _assert_same_records(records, _litdata_records(folders / name, name))
    batched = [r for batch in litdata_format.read_batches(unit) for r in batch.records()]
    _assert_same_records(batched, records)


def test_token_blocks_never_span_chunks(folders: Path) -> None:
    # LitData drops each chunk's tokens past its last whole block; so does the reader.
    index = index_of(_unit(str(folders / "tokens"), "tokens"))
    assert (index.dims % SEQ_LEN["tokens"]).any()
    records = list(litdata_format.read(_unit(str(folders / "tokens"), "tokens")))
    assert len(records) == int((index.dims // SEQ_LEN["tokens"]).sum())


def test_litdata_s_dtype_codes_are_the_reader_s() -> None:
    from litdata.constants import _NUMPY_DTYPES_MAPPING, _TORCH_DTYPES_MAPPING

    numeric = {code: t for code, t in _NUMPY_DTYPES_MAPPING.items() if t.kind in "biufc"}
    assert numeric == NUMPY_CODES
    assert set(_NUMPY_DTYPES_MAPPING) - set(NUMPY_CODES) == {14, 15, 16, 17}  # object, str ...
    for code, dtype in _TORCH_DTYPES_MAPPING.items():
        if dtype == torch.bfloat16:
            assert code not in TORCH_CODES
        else:
            assert torch.empty(0, dtype=dtype).numpy().dtype == TORCH_CODES[code]


@pytest.mark.parametrize("name", FAST)
def test_shards_are_the_bytes_of_the_import_through_litdata(
    folders: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(folders / name)
    outputs = {}
    for part_bytes, workers in ((1 << 30, 1), (700, 1), (700, 2)):
        out = tmp_path / f"direct-{part_bytes}-{workers}"
        build_import(_config(source, out, name, part_bytes=part_bytes, workers=workers))
        outputs[out.name] = dir_bytes(out)
    monkeypatch.setattr(litdata_format, "layout_of", lambda index, seq_len: None)
    build_import(_config(source, tmp_path / "litdata", name))
    through_litdata = dir_bytes(tmp_path / "litdata")
    assert any(key.startswith("shard.") for key in through_litdata)
    assert all(out == through_litdata for out in outputs.values())


def test_the_direct_reader_never_starts_litdata(folders: Path, tmp_path: Path) -> None:
    script = (
        "import json, sys\n"
        "from shardstream.shard_builder.importers import ImportConfig, build_import\n"
        "for source, out, seq_len in json.loads(sys.argv[1]):\n"
        "    build_import(ImportConfig(format='litdata', inputs=(source,), output=out,\n"
        "        seq_len=seq_len, shard_size=4096, allow_small_shards=True, progress=False))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'litdata')))\n"
    )

    def litdata_modules(names: list[str]) -> list[str]:
        runs = [(str(folders / n), str(tmp_path / n), SEQ_LEN.get(n)) for n in names]
        done = subprocess.run(
            [sys.executable, "-c", script, json.dumps(runs)], capture_output=True, check=True
        )
        modules: list[str] = json.loads(done.stdout.decode().splitlines()[-1])
        return modules

    assert litdata_modules(FAST) == []
    assert "litdata.streaming.dataset" in litdata_modules(["zstd"])  # LitData's to read


def _watch_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A fresh temp folder for the test (to see what is left in it), and the keys that the
    S3 store downloads from now on, in order."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    downloads: list[str] = []
    download = S3Store.download

    def counted(store: S3Store, key: str, dest: Path, **kwargs: Any) -> None:
        downloads.append(key)
        download(store, key, dest, **kwargs)

    monkeypatch.setattr(S3Store, "download", counted)
    return temp, downloads


def _upload(folder: Path, url: str) -> None:
    store = open_store(url)
    for path in sorted(folder.iterdir()):
        store.upload(path, path.name)


@pytest.mark.parametrize("name", [*FAST, "zstd"])
def test_an_s3_prefix_imports_to_the_folder_s_bytes_and_leaves_no_copy(
    folders: Path, name: str, tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3_bucket.url}/lit/{name}"
    _upload(folders / name, url)
    temp, downloads = _watch_downloads(tmp_path, monkeypatch)
    build_import(_config(str(folders / name), tmp_path / "local", name, part_bytes=1500))
    build_import(_config(url, tmp_path / "remote", name, part_bytes=1500, workers=2))
    build_import(_config(url, tmp_path / "remote1", name, part_bytes=1500))
    local = dir_bytes(tmp_path / "local")
    del local["shardstream.json"]  # names the input
    for out in ("remote", "remote1"):
        remote = dir_bytes(tmp_path / out)
        del remote["shardstream.json"]
        assert remote == local
    assert list(temp.iterdir()) == []  # no copy left behind
    assert bool(downloads) == (name == "zstd")  # the direct reader reads ranges in memory


def _middle_part(unit: SourceUnit) -> tuple[SourceUnit, tuple[int, int, int, int]]:
    """A part of ``unit`` inside one chunk, neither at its start nor at its end."""
    index = index_of(unit)
    for part in litdata_format.split(unit, 500):
        pieces = list(index.pieces(0, part.span))
        if len(pieces) == 1:
            chunk, _, lo, hi = pieces[0]
            if lo > 0 and hi < index.items[chunk]:
                return part, pieces[0]
    raise AssertionError("no part in the middle of a chunk")


def test_a_part_of_an_s3_prefix_reads_byte_ranges_of_its_own_chunk(
    folders: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3_bucket.url}/lit/mixed"
    _upload(folders / "mixed", url)
    part, (chunk, _, _, _) = _middle_part(_unit(url, "mixed"))
    name = index_of(part).names[chunk]
    ranges: list[tuple[str, int, int]] = []
    read_range = S3Store.read_range

    def counted(store: S3Store, key: str, start: int, stop: int, **kwargs: Any) -> Any:
        ranges.append((key, start, stop))
        return read_range(store, key, start, stop, **kwargs)

    monkeypatch.setattr(S3Store, "read_range", counted)
    first, end = part.span
    records = list(litdata_format.read(part))
    assert [where for where, _ in records] == [f"{url} item {i}" for i in range(first, end)]
    assert {key for key, _, _ in ranges} == {name}
    assert (
        sum(stop - start for _, start, stop in ranges)
        < (folders / "mixed" / name).stat().st_size / 2
    )


def test_a_part_litdata_reads_downloads_its_chunk_and_removes_it(
    folders: Path, tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3_bucket.url}/lit/zstd"
    _upload(folders / "zstd", url)
    part, (chunk, _, _, _) = _middle_part(_unit(url, "zstd"))
    temp, downloads = _watch_downloads(tmp_path, monkeypatch)
    records = list(litdata_format.read(part))
    assert len(records) == part.span[1] - part.span[0]
    assert downloads == ["index.json", index_of(part).names[chunk]]
    assert list(temp.iterdir()) == []
    reader = litdata_format.read_batches(part)
    next(reader)  # given up after one batch: the copy goes too
    assert len(list(temp.iterdir())) == 1
    reader.close()
    assert list(temp.iterdir()) == []


# A damaged chunk: one InputError naming the chunk file and the item.


def _offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    (count,) = struct.unpack_from("<I", data)
    return list(struct.unpack_from(f"<{count + 1}I", data, 4))


def _truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def _patch(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at : at + len(data)] = data
    path.write_bytes(bytes(raw))


def _damage(folder: Path, kind: str) -> tuple[str, int]:
    """Damage ``folder`` (a copy) one way; the chunk file and item the error must name."""
    index = json.loads((folder / "index.json").read_text())
    first = index["chunks"][0]
    name = index["chunks"][1]["filename"]
    base = first["dim"] // SEQ_LEN["tokens"] if first["dim"] else first["chunk_size"]
    path = folder / name
    offsets = _offsets(path) if not kind.startswith("footer") else []
    if kind == "truncated":
        _truncate(path, (offsets[4] + offsets[5]) // 2)  # item 4 cut short
        return name, base + 4
    if kind == "offsets":
        _patch(path, 4 + 4 * 3, struct.pack("<I", offsets[5] + 1))  # item 3 starts past its end
        return name, base + 3
    if kind == "count":
        _patch(path, 0, struct.pack("<I", len(offsets)))
        return name, base
    if kind == "leaf-sizes":
        _patch(path, offsets[3], struct.pack("<I", 9))  # item 3's int leaf: 9 bytes
        return name, base + 3
    if kind == "utf8":
        begin = offsets[2]
        (id_size,) = struct.unpack_from("<I", path.read_bytes(), begin)
        _patch(path, begin + 4 * 9 + id_size, b"\xff")  # item 2's str leaf (after 9 sizes)
        return name, base + 2
    if kind == "missing":
        path.unlink()
        return name, base
    if kind == "footer-length":
        _patch(path, path.stat().st_size - 12, struct.pack("<I", 1 << 30))
        return name, base
    if kind == "footer-bytes":  # the end of the Arrow file: its schema and batch list
        _patch(path, path.stat().st_size - 60, bytes(48))
        return name, base
    raise AssertionError(kind)


DAMAGES = [
    ("mixed", "truncated"),
    ("mixed", "offsets"),
    ("mixed", "count"),
    ("mixed", "leaf-sizes"),
    ("mixed", "utf8"),
    ("mixed", "missing"),
    ("flat", "footer-length"),
    ("flat", "footer-bytes"),
    ("tokens", "count"),
]


@pytest.mark.parametrize(("name", "kind"), DAMAGES)
def test_a_damaged_chunk_is_one_error_naming_file_and_item(
    folders: Path, name: str, kind: str, tmp_path: Path
) -> None:
    folder = tmp_path / name
    shutil.copytree(folders / name, folder)
    chunk, item = _damage(folder, kind)
    with pytest.raises(InputError) as caught:
        build_import(_config(str(folder), tmp_path / "out", name))
    message = str(caught.value)
    assert f"{folder} item {item}: LitData chunk {chunk} is " in message  # damaged, missing
    assert not (tmp_path / "out" / "index.json").exists()


def test_truncated_token_chunks_name_the_first_block_cut(folders: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    shutil.copytree(folders / "tokens", folder)
    index = json.loads((folder / "index.json").read_text())
    chunk = index["chunks"][1]
    head, width = 4 * (chunk["chunk_size"] + 2), SEQ_LEN["tokens"] * 2
    _truncate(folder / chunk["filename"], head + 5 * width + 3)  # block 5 cut short
    first = index["chunks"][0]["dim"] // SEQ_LEN["tokens"]
    with pytest.raises(InputError, match=rf"item {first + 5}: LitData chunk {chunk['filename']}"):
        list(litdata_format.read(_unit(str(folder), "tokens")))
