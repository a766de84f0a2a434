"""Big files split into parts (LMDB key ranges, TFRecord record ranges, LitData item ranges,
Arrow record batch and Parquet row group ranges):
the parts read back to back are the whole file, and the shards are the same bytes whatever
the part size and the number of workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from litdata import optimize

from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.shard_builder.importers.formats import get_format
from shardstream.shard_builder.importers.source import SourceUnit
from shardstream.storage import open_store
from tests.builder.conftest import dir_bytes, write_lmdb
from tests.fixtures.build_runs import kill_when_journaled
from tests.fixtures.foreign_shards import write_tfrecord
from tests.fixtures.s3 import S3Bucket

SMALL = {"shard_size": 6 * 1024, "allow_small_shards": True, "progress": False}


def _lmdb(root: Path) -> str:
    return write_lmdb(root, 300, base=50, spread=170)


def _item(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"item-{i}", "blob": bytes([i % 256]) * (i % 60 + 1)}


def _litdata(root: Path) -> str:
    optimize(fn=_item, inputs=list(range(240)), output_dir=str(root / "lit"),
             chunk_bytes="4KB", num_workers=1, verbose=False)  # fmt: skip
    return str(root / "lit")


def _hf_table(n: int) -> Any:
    import pyarrow as pa

    return pa.table(
        {
            "text": [f"row {i}" * (i % 5) for i in range(n)],
            "blob": [bytes([i % 256]) * (i % 70) for i in range(n)],
            "score": [i / 9 for i in range(n)],
            "ids": [list(range(i % 4 + 1)) for i in range(n)],  # a list column: rows
        }
    )


def _hf_arrow(root: Path) -> str:
    """An Arrow stream file (as ``save_to_disk`` writes) of many small record batches."""
    import pyarrow as pa

    table = _hf_table(260)
    path = str(root / "data.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=20)
    return path


def _hf_parquet(root: Path) -> str:
    import pyarrow.parquet as pq

    pq.write_table(_hf_table(260), root / "data.parquet", row_group_size=20)
    return str(root / "data.parquet")


# name -> (format, source maker)
SOURCES = {
    "lmdb": ("lmdb", _lmdb),
    "tfrecord": ("tfrecord", write_tfrecord),
    "litdata": ("litdata", _litdata),
    "hf-arrow": ("hf", _hf_arrow),
    "hf-parquet": ("hf", _hf_parquet),
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_parts_read_back_to_back_are_the_whole_file(name: str, tmp_path: Path) -> None:
    fmt, make = SOURCES[name]
    source = make(tmp_path)
    form = get_format(fmt)
    assert form.split is not None
    (unit,) = form.plan((source,), "")
    whole = [(where, sample) for where, sample in form.read(unit)]
    parts = form.split(unit, 1500)
    assert len(parts) > 4 and sum(p.nbytes for p in parts) == unit.nbytes
    pieced = [record for part in parts for record in form.read(part)]
    assert [w for w, _ in pieced] == [w for w, _ in whole]
    for (_, got), (_, want) in zip(pieced, whole, strict=True):
        assert got.keys() == want.keys()
        for name, (encoding, value) in got.items():
            assert encoding == want[name][0]
            assert np.array_equal(np.asarray(value), np.asarray(want[name][1]))
    assert form.split(unit, unit.nbytes) == [unit]  # a file within one part stays whole
    assert all(isinstance(p, SourceUnit) and p.path == unit.path for p in parts)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_same_bytes_whatever_the_parts_and_workers(name: str, tmp_path: Path) -> None:
    fmt, make = SOURCES[name]
    source = make(tmp_path)
    outputs = []
    for part_bytes, workers in ((1 << 30, 1), (1500, 1), (1500, 2), (4000, 5)):
        out = tmp_path / f"out-{part_bytes}-{workers}"
        result = build_import(
            ImportConfig(
                format=fmt, inputs=(source,), output=str(out), workers=workers,
                part_bytes=part_bytes, **SMALL,
            )
        )  # fmt: skip
        assert len(result.shards) > 3
        outputs.append(dir_bytes(out))
    assert all(o == outputs[0] for o in outputs[1:])
    assert not any(".shardstream-build" in name for name in outputs[0])  # no spool left


def test_killed_import_resumes_with_other_parts_to_the_same_bytes(tmp_path: Path) -> None:
    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for i in range(6_000):
            txn.put(f"k{i:06d}".encode(), bytes([i % 256]) * (100 + i % 200))
    env.close()
    out, clean = tmp_path / "out", tmp_path / "clean"

    def config(output: Path, part_bytes: int, workers: int) -> ImportConfig:
        return ImportConfig(
            format="lmdb", inputs=(str(tmp_path / "db"),), output=str(output),
            part_bytes=part_bytes, workers=workers, **SMALL,
        )  # fmt: skip

    script = (
        "import sys; from shardstream.shard_builder.importers import ImportConfig, build_import; "
        "build_import(ImportConfig(format='lmdb', inputs=(sys.argv[1],), output=sys.argv[2], "
        "part_bytes=150_000, workers=4, shard_size=6 * 1024, allow_small_shards=True, "
        "progress=False))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "db"), str(out)],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    killed_after = kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=40)
    assert not (out / "index.json").exists()
    # Resumed with another part size and worker count: positions count records, not parts.
    resumed = build_import(config(out, 400_000, 1))
    assert resumed.reused_shards >= killed_after
    build_import(config(clean, 1 << 30, 1))
    assert dir_bytes(out) == dir_bytes(clean)
    assert len(resumed.shards) > killed_after + 20  # killed mid-way


def test_parts_imported_into_s3_match_a_local_import(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    # A remote output stages shards (and the workers' spool files) in a temp folder.
    source = write_tfrecord(tmp_path)
    local = tmp_path / "local"
    for output, workers in ((str(local), 1), (f"{s3_bucket.url}/imported", 2)):
        build_import(
            ImportConfig(
                format="tfrecord", inputs=(source,), output=output, workers=workers,
                part_bytes=1500, **SMALL,
            )
        )  # fmt: skip
    store = open_store(f"{s3_bucket.url}/imported")
    remote = {key: store.read_bytes(key) for key, _ in store.list("")}
    assert remote == dir_bytes(local)
