"""A Parquet file of big values is read within a memory bound, and a value too big for the
memory left is one error line naming the file and the column.

Record batches were 1,024 rows whatever the rows held: a file of 1,000 pages of large
values died of ``ArrowMemoryError`` (a gigabyte realloc), and a column of 32 MiB values of
zeros (zstd: a thousandfold expansion) ended in a 38-line traceback under a memory cap.
The files here are a few KB on disk (zstd zeros); the caps are set with ``RLIMIT_AS`` in a
child process, after its imports.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardstream.shard_builder.importers import hf
from shardstream.shard_builder.importers.source import SourceUnit

MiB = 1 << 20

CHILD = """
import re, resource, sys
import pyarrow, pyarrow.parquet  # noqa: the cap is set after every import
from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import, build, hf  # noqa
config = ImportConfig(format="hf", inputs=(sys.argv[2],), output=sys.argv[3],
                      shard_size=1 << 20, allow_small_shards=True, workers=1, progress=False)
size = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
cap = size + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
try:
    build_import(config)
    print("imported")
except InputError as exc:
    print("InputError:", exc)
"""


def _zeros_parquet(path: Path, rows: int, size: int) -> Path:
    """``rows`` rows of an ``id`` and a ``blob`` of ``size`` zero bytes, a page per row,
    zstd-compressed (a few KB on disk); the zeros are allocated lazily, so writing them
    costs little memory."""
    data = np.zeros(rows * size, np.uint8)
    offsets = np.arange(0, rows * size + 1, size, dtype=np.int64)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    blob = pa.LargeBinaryArray.from_buffers(pa.large_binary(), rows, buffers)
    table = pa.table({"id": pa.array(range(rows)), "blob": blob})
    pq.write_table(
        table, path, compression="zstd", use_dictionary=False, write_statistics=False,
        data_page_size=min(size, MiB), write_batch_size=1,
    )  # fmt: skip
    return path


def _capped_import(source: Path, out: Path, headroom: int) -> list[str]:
    """The lines a child process prints importing ``source`` with ``headroom`` bytes of
    address space beyond what its imports took (one glibc arena and 1 MiB thread stacks,
    so that the cap counts memory, not reserved address space)."""

    def small_stacks() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (MiB, MiB))

    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(headroom), str(source), str(out)],
        capture_output=True, text=True, timeout=300, check=False, preexec_fn=small_stacks,
        env={**os.environ, "MALLOC_ARENA_MAX": "1"},
    )  # fmt: skip
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_batches_of_big_values_hold_a_few_megabytes(tmp_path: Path) -> None:
    path = _zeros_parquet(tmp_path / "pages.parquet", 1000, 32 * 1024)
    _, batches = hf._batches(str(path))
    sizes = [b.num_rows for b in batches]
    assert sum(sizes) == 1000  # in one batch before
    assert hf.BATCH_BYTES // (64 * 1024) <= max(sizes) <= hf.BATCH_BYTES // (32 * 1024)


def test_small_values_still_come_1024_rows_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "small.parquet"
    pq.write_table(pa.table({"n": pa.array(range(3000))}), path)
    _, batches = hf._batches(str(path))
    assert [b.num_rows for b in batches] == [1024, 1024, 952]


def test_a_file_of_1000_big_pages_imports_under_a_memory_cap(tmp_path: Path) -> None:
    # 31 MiB of values: 1,024-row batches (and the copies made of them) took more than
    # 64 MiB of address space; batches of 4 MiB fit.
    path = _zeros_parquet(tmp_path / "pages.parquet", 1000, 32 * 1024)
    assert path.stat().st_size < 100_000
    out = tmp_path / "out"
    assert _capped_import(path, out, 64 * MiB) == ["imported"]
    index = json.loads((out / "index.json").read_text())
    assert sum(s["samples"] for s in index["shards"]) == 1000


def test_a_value_too_big_for_the_memory_left_is_one_error_naming_file_and_column(
    tmp_path: Path,
) -> None:
    path = _zeros_parquet(tmp_path / "huge.parquet", 2, 32 * MiB)  # 1,000x in zstd
    assert path.stat().st_size < 20_000
    lines = _capped_import(path, tmp_path / "out", 64 * MiB)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"InputError: {path} rows 0..")
    assert "column 'blob'" in lines[0] and "memory left" in lines[0]
    assert not (tmp_path / "out" / "index.json").exists()


def test_a_part_reads_its_own_row_groups_only(tmp_path: Path) -> None:
    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"n": pa.array(range(100))}), path, row_group_size=10)
    unit = SourceUnit(str(path), path.stat().st_size, span=(3, 5), first=30)
    rows = [r for _, sample in hf.read(unit) for r in [sample["n"][1]]]
    assert rows == list(range(30, 50))
