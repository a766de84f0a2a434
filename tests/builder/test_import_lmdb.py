"""``shardstream import lmdb``: databases written with the ``lmdb`` library."""

from __future__ import annotations

import io
import json
from pathlib import Path

import lmdb
import numpy as np
import pytest

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from tests.builder.conftest import read_with_ours

SMALL = {"shard_size": 4 * 1024, "allow_small_shards": True, "progress": False}


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _write(path: Path, values: dict[bytes, bytes]) -> None:
    env = lmdb.open(str(path), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for key, value in values.items():
            txn.put(key, value)
    env.close()


def test_npy_values_come_back_in_key_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    arrays = {f"k{i:04d}".encode(): rng.integers(0, 1000, (i % 6 + 1, 2)) for i in range(200)}
    _write(tmp_path / "db", {k: _npy(v) for k, v in arrays.items()})
    config = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "db"),), value_format="npy",
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    result = build_import(config)
    assert result.columns == {"key": "bytes", "value": "ndarray"} and len(result.shards) > 2
    got = read_with_ours(tmp_path / "out")
    assert [s["key"] for s in got] == sorted(arrays)
    for sample in got:
        want = arrays[sample["key"]]
        assert sample["value"].dtype == want.dtype and np.array_equal(sample["value"], want)


def test_a_value_that_does_not_parse_names_database_and_key(tmp_path: Path) -> None:
    values = {f"r{i}".encode(): json.dumps({"i": i}).encode() for i in range(20)}
    values[b"r13"] = b"{not json"
    _write(tmp_path / "db", values)
    config = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "db"),), value_format="json",
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"db key b'r13': the value is not json"):
        build_import(config)
    assert not (tmp_path / "out" / "index.json").exists()


def test_pickled_values_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"only with --allow-pickle.*runs whatever code"):
        ImportConfig(format="lmdb", inputs=("db",), value_format="pickle", output="o")


def test_pickled_values_load_with_allow_pickle(tmp_path: Path) -> None:
    import pickle

    values = {
        f"k{i:03d}".encode(): {"i": i, "name": f"n{i}", "tags": [i, i + 1]} for i in range(60)
    }
    _write(tmp_path / "db", {k: pickle.dumps(v) for k, v in values.items()})
    config = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "db"),), value_format="pickle",
        allow_pickle=True, output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    result = build_import(config)
    assert result.columns == {"key": "bytes", "value": "json"}
    got = read_with_ours(tmp_path / "out")
    assert {s["key"]: s["value"] for s in got} == values
    # A pickle of a type MDS cannot hold, and one that does not unpickle: one clear error.
    _write(tmp_path / "bad", {b"a": pickle.dumps({1, 2}), b"b": b"\x80\x05junk"})
    bad = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "bad"),), value_format="pickle",
        allow_pickle=True, output=str(tmp_path / "out2"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"bad key b'a': the unpickled value is a builtins.set"):
        build_import(bad)


def test_a_cold_database_is_read_with_readahead(tmp_path: Path) -> None:
    """Entries are read in key order from a memory map: with the kernel's readahead a cold
    file comes in large reads; without it, every 4 KiB page is a disk read of its own (the
    import of a cold 160 MB database took 5.3 s instead of 0.6 s)."""
    import os
    import resource

    rng = np.random.default_rng(5)
    _write(tmp_path / "db", {f"k{i:05d}".encode(): rng.bytes(8192) for i in range(3000)})
    data = tmp_path / "db" / "data.mdb"
    pages = data.stat().st_size // 4096
    fd = os.open(data, os.O_RDONLY)
    try:  # out of the page cache, as a database on disk that nothing has read yet
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    config = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "db"),), output=str(tmp_path / "out"),
        workers=1, **SMALL,
    )  # fmt: skip
    assert build_import(config).samples == 3000
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - before
    assert faults < pages // 8, f"{faults} disk reads for {pages} pages"
