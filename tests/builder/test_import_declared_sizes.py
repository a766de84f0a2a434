"""Sizes an input file declares are checked against the file before anything is allocated.

A ``.npy`` header (a WebDataset member, an LMDB value) and a TFRecord length are numbers
an archive from elsewhere chooses: a 200-byte member declaring 72.8 TiB ended in numpy's
``ArrayMemoryError``, TFRecord lengths of 2**64 - 1 and 2**63 - 8 in ``OverflowError`` and
``IndexError`` tracebacks. Each is one :class:`InputError` line naming the file and where.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.shard_builder.importers.npy import load_npy
from shardstream.shard_builder.importers.tfrecord import masked_crc
from tests.builder.conftest import read_with_ours

SMALL = {"shard_size": 16 * 1024, "allow_small_shards": True, "progress": False}
HUGE_SHAPE = (10_000_000, 1_000_000)  # of float64: 8e13 bytes, 72.8 TiB


def _npy(arr: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _lying_npy(shape: tuple[int, ...], data: bytes = b"\0" * 64) -> bytes:
    """A ``.npy`` whose header declares ``shape`` of float64, followed by ``data``."""
    return _npy_with_header(repr({"descr": "<f8", "fortran_order": False, "shape": shape}), data)


def _npy_with_header(header: str, data: bytes = b"") -> bytes:
    """A version 1.0 ``.npy`` of the header text ``header`` (padded as numpy pads it)."""
    body = header.encode("latin1")
    text = body + b" " * (-(10 + len(body) + 1) % 64) + b"\n"  # magic, version, length: 10
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + data


def _import(fmt: str, source: Path, out: Path, **kw: object) -> None:
    options: dict[str, Any] = {**SMALL, **kw}
    config = ImportConfig(format=fmt, inputs=(str(source),), output=str(out), **options)
    build_import(config)


def _one_line(info: pytest.ExceptionInfo[InputError]) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_webdataset_npy_declaring_72_tib_is_one_error_naming_the_member(
    tmp_path: Path,
) -> None:
    tar = _tar(
        tmp_path / "shard-0.tar",
        [("a.npy", _npy(np.arange(6.0))), ("b.npy", _lying_npy(HUGE_SHAPE))],
    )
    with pytest.raises(InputError) as info:
        _import("webdataset", tar, tmp_path / "out")
    text = _one_line(info)
    assert "shard-0.tar key b.npy: cannot read the npy member" in text
    assert "(10000000, 1000000)" in text and "80,000,000,000,000 bytes" in text
    assert not (tmp_path / "out" / "index.json").exists()


def test_an_lmdb_npy_value_declaring_72_tib_is_one_error_naming_the_key(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"k1", _npy(np.arange(3)))
        txn.put(b"k2", _lying_npy(HUGE_SHAPE))
    env.close()
    with pytest.raises(InputError) as info:
        _import("lmdb", tmp_path / "db", tmp_path / "out", value_format="npy")
    text = _one_line(info)
    assert "db key b'k2': the value is not npy" in text and "(10000000, 1000000)" in text


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_lying_npy((5,), b"\0" * 39), r"shape \(5,\) of float64 \(40 bytes\), but only 39"),
        (_lying_npy((-1, 4)), r"invalid shape \(-1, 4\)"),
        (_npy(np.arange(3))[:7], r"EOF|magic"),
        # numpy's own parser let tokenize.TokenError (no ValueError) out of np.load
        (_npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (3,"), "header"),
        (_npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}"), "object"),
    ],
    ids=["one-byte-short", "negative", "cut-magic", "unclosed-header", "object"],
)
def test_a_damaged_npy_is_a_value_error_saying_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        load_npy(data)


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12.0).reshape(3, 4),
        np.asfortranarray(np.arange(12).reshape(3, 4)),
        np.zeros((0, 5), np.int16),
        np.array(["ab", "c"]),
        np.zeros(3, dtype=[("é", "<i4"), ("b", "u1")]),  # a version 3.0 header
    ],
    ids=["float", "fortran", "empty", "unicode", "structured-v3"],
)
def test_a_good_npy_loads_as_np_load_reads_it(array: np.ndarray[Any, Any]) -> None:
    data = _npy(array)
    got, want = load_npy(data), np.load(io.BytesIO(data), allow_pickle=False)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want) and got.flags.writeable


def _frame(data: bytes, length: int | None = None) -> bytes:
    """One TFRecord record of ``data``, its header declaring ``length`` (with a correct
    length CRC, so only the size is a lie)."""
    head = (len(data) if length is None else length).to_bytes(8, "little")
    crc = masked_crc(head).to_bytes(4, "little")
    return head + crc + data + masked_crc(data).to_bytes(4, "little")


def _example(value: int) -> bytes:
    """A ``tf.train.Example`` with one int64 feature ``n`` of ``value`` (< 128)."""
    feature = b"\x1a\x03\x0a\x01" + bytes([value])  # Feature.int64_list{value: [value]}
    entry = b"\x0a\x01n" + b"\x12" + bytes([len(feature)]) + feature
    features = b"\x0a" + bytes([len(entry)]) + entry
    return b"\x0a" + bytes([len(features)]) + features


@pytest.mark.parametrize("length", [2**64 - 1, 2**63 - 8], ids=["2^64-1", "2^63-8"])
@pytest.mark.parametrize(
    ("workers", "part_bytes"), [(1, 1 << 20), (2, 1 << 20), (1, 40)], ids=["read", "w2", "split"]
)
def test_a_tfrecord_length_past_the_file_is_one_error_naming_the_record(
    tmp_path: Path, length: int, workers: int, part_bytes: int
) -> None:
    path = tmp_path / "a.tfrecord"
    good = b"".join(_frame(_example(i)) for i in range(3))
    path.write_bytes(good + _frame(_example(3), length) + b"\0" * 100)
    with pytest.raises(InputError) as info:
        _import("tfrecord", path, tmp_path / "out", workers=workers, part_bytes=part_bytes)
    text = _one_line(info)
    assert f"a.tfrecord record 3 (byte {len(good)}): truncated record ({length} bytes" in text
    assert f"holds {len(_example(3)) + 100} more" in text  # what follows the lying header


def test_a_tfrecord_within_its_file_still_imports_whole_after_a_split(tmp_path: Path) -> None:
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(_frame(_example(i)) for i in range(20)))
    _import("tfrecord", path, tmp_path / "out", part_bytes=40)
    got = [s["n"] for s in read_with_ours(tmp_path / "out")]
    assert [int(n[0]) for n in got] == list(range(20))  # type: ignore[index]
