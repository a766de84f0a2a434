"""``shardstream import tfrecord``: files written by the ``tfrecord`` package (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tfrecord.reader import tfrecord_loader
from tfrecord.writer import TFRecordWriter

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from tests.builder.conftest import jpeg_bytes, read_with_ours

SMALL = {"shard_size": 8 * 1024, "allow_small_shards": True, "progress": False}


def _write(folder: Path, files: int = 2, per_file: int = 40) -> list[dict[str, Any]]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    written: list[dict[str, Any]] = []
    for f in range(files):
        writer = TFRecordWriter(str(folder / f"part-{f:03d}.tfrecord"))
        for i in range(per_file):
            n = f * per_file + i
            datum = {
                "image": (jpeg_bytes(n, (16, 16)), "byte"),
                "label": (n - 30, "int"),  # negative values too
                "embedding": (rng.standard_normal(n % 5 + 1).astype(np.float32).tolist(), "float"),
                "tags": ([b"x", f"t{n}".encode()], "byte"),
            }
            writer.write(datum)
            written.append(datum)
        writer.close()
    return written


def test_every_example_comes_back_field_by_field(tmp_path: Path) -> None:
    written = _write(tmp_path / "tfr")
    result = build_import(
        ImportConfig(
            format="tfrecord",
            inputs=(str(tmp_path / "tfr"),),
            output=str(tmp_path / "out"),
            workers=2,
            **SMALL,
        )
    )
    assert result.columns == {
        "embedding": "ndarray",
        "image": "bytes",
        "label": "ndarray",
        "tags": "json",
    }
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == len(written) == 80 and len(result.shards) > 2
    theirs = [
        rec for f in sorted((tmp_path / "tfr").iterdir()) for rec in tfrecord_loader(str(f), None)
    ]
    for got, want, lib in zip(ours, written, theirs, strict=True):
        assert got["image"] == want["image"][0] == bytes(lib["image"])
        assert got["label"].tolist() == [want["label"][0]] == lib["label"].tolist()
        assert got["embedding"].dtype == np.float32
        assert np.array_equal(got["embedding"], np.asarray(want["embedding"][0], np.float32))
        assert np.array_equal(got["embedding"], lib["embedding"])
        assert got["tags"] == [t.decode() for t in want["tags"][0]]


def test_bad_crc_is_one_clear_error_naming_file_and_record(tmp_path: Path) -> None:
    _write(tmp_path / "tfr", files=1, per_file=5)
    path = tmp_path / "tfr" / "part-000.tfrecord"
    data = bytearray(path.read_bytes())
    first_len = int.from_bytes(data[:8], "little")
    data[16 + first_len + 12 + 5] ^= 0xFF  # a byte inside record 1's data
    path.write_bytes(bytes(data))
    with pytest.raises(
        InputError, match=r"part-000\.tfrecord record 1 .*bad CRC of the record data"
    ):
        build_import(
            ImportConfig(
                format="tfrecord", inputs=(str(path),), output=str(tmp_path / "out"), **SMALL
            )
        )
    assert not (tmp_path / "out" / "index.json").exists()
