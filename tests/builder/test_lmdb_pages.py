"""Garbled LMDB files (flipped bytes in meta, branch, leaf and overflow pages, a cut file,
a zeroed page) are one error naming the file and the page, checked from Python before
liblmdb reads them: never a worker killed by SIGBUS or SIGSEGV, never a partial dataset."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import, lmdb_pages
from shardstream.shard_builder.importers.lmdb_pages import check
from tests.builder.conftest import read_with_ours

SMALL = {"shard_size": 16 * 1024, "allow_small_shards": True, "progress": False}
HEADER = {0: 16, 1: 24}  # page header bytes of LMDB 0.9 and 1.0 files


def _write(folder: Path, lib: int = 0) -> Path:
    """A database of three levels (long keys: few to a branch page), small values beside
    their keys and big ones on overflow pages."""
    env = lmdb.open(str(folder), map_size=1 << 28, lib_version=lib)
    with env.begin(write=True) as txn:
        for i in range(1500):
            value = bytes([i % 256]) * (6000 if i % 7 == 0 else 90)
            txn.put(b"%05d" % i + b"k" * 195, value)
    env.close()
    return folder / "data.mdb"


class _Pages:
    """Where a test database keeps what each case garbles, found by reading the format
    (mdb.c) independently of the code under test: the newest meta page, the root and a
    branch below it, a leaf, a node on it, a value's overflow pages."""

    def __init__(self, data: Path, lib: int) -> None:
        self.raw = data.read_bytes()
        self.h = h = HEADER[lib]
        self.base = 0 if lib == 0 else h
        psize = self.u(h + 24, 4)
        self.psize = psize
        txn0, txn1 = self.u(h + 128, 8), self.u(psize + h + 128, 8)
        self.meta = 1 if txn1 > txn0 else 0
        self.main = self.meta * psize + h + 72  # the main database's MDB_db
        self.root = self.u(self.main + 40, 8)
        assert self.u(self.main + 6, 2) == 3, "three levels"
        self.branch = self.child(self.root, 0)
        self.leaf = self.child(self.branch, 0)
        self.big = next(n for n in self.nodes(self.leaf) if self.u(n + 4, 2) & 1)
        self.overflow = self.u(self.big + 8 + self.u(self.big + 6, 2), 8)

    def u(self, at: int, n: int) -> int:
        return int.from_bytes(self.raw[at : at + n], "little")

    def nodes(self, page: int) -> list[int]:
        at = page * self.psize
        lower = self.u(at + self.h - 4, 2)
        count = (lower - (self.h - self.base)) // 2
        return [at + self.base + self.u(at + self.h + 2 * i, 2) for i in range(count)]

    def child(self, page: int, i: int) -> int:
        node = self.nodes(page)[i]
        return self.u(node, 4) | self.u(node + 4, 2) << 32

    def flags(self, page: int) -> int:
        return page * self.psize + self.h - 6


Damage = Callable[[_Pages], tuple[int, bytes, str]]  # (offset, bytes written there, page)
CASES: dict[str, Damage] = {
    # Meta pages: the root, the counts, the last page in use, the magic, the page size.
    "meta-root": lambda p: (p.main + 40, b"\x00\x00\x00\x01", f"{p.meta}"),
    "meta-entries": lambda p: (p.main + 32, b"\x07", f"{p.meta}"),
    "meta-depth": lambda p: (p.main + 6, b"\x02", f"{p.branch}"),  # a branch as a leaf
    "meta-last-page": lambda p: (p.meta * p.psize + p.h + 120, b"\x05\x00", f"{p.meta}"),
    "meta-magic": lambda p: (p.meta * p.psize + p.h, b"\x00", f"{p.meta}"),
    "meta-page-size": lambda p: (p.h + 24, b"\x00\x30", "0"),
    "meta-flags": lambda p: (p.flags(p.meta), b"\x02", f"{p.meta}"),
    # Branch pages: the header's page number, flags and bounds; a child's page number.
    "root-pgno": lambda p: (p.root * p.psize, b"\x01", f"{p.root}"),
    "root-flags": lambda p: (p.flags(p.root), b"\x02", f"{p.root}"),
    "branch-flags-high": lambda p: (p.flags(p.branch) + 1, b"\x01", f"{p.branch}"),
    "branch-lower": lambda p: (p.flags(p.branch) + 2, b"\xf0\x0f", f"{p.branch}"),
    "branch-child": lambda p: (p.nodes(p.branch)[1] + 2, b"\x00\x01", f"{p.branch}"),
    "branch-child-cycle": lambda p: (
        p.nodes(p.branch)[1],
        p.root.to_bytes(4, "little"),
        f"{p.branch}",
    ),
    # Leaf pages: the header; a node's key size, value size, flags, pointer.
    "leaf-pgno": lambda p: (p.leaf * p.psize + 1, b"\x7f", f"{p.leaf}"),
    "leaf-flags": lambda p: (p.flags(p.leaf), b"\x01", f"{p.leaf}"),
    "leaf-upper": lambda p: (p.flags(p.leaf) + 4, b"\xff\xff", f"{p.leaf}"),
    "leaf-key-size": lambda p: (p.nodes(p.leaf)[0] + 6, b"\xff\xff", f"{p.leaf}"),
    "leaf-value-size": lambda p: (p.nodes(p.leaf)[1], b"\xff\xff\xff\x7f", f"{p.leaf}"),
    "leaf-node-flags": lambda p: (p.nodes(p.leaf)[1] + 4, b"\x08", f"{p.leaf}"),
    "leaf-pointer": lambda p: (p.leaf * p.psize + p.h, b"\xfe\x0f", f"{p.leaf}"),
    # Overflow pages: the value's first page, its header; the run past the file.
    "value-first-page": lambda p: (
        p.big + 8 + p.u(p.big + 6, 2) + 4,
        b"\x01",
        f"{p.leaf}",
    ),
    "overflow-pgno": lambda p: (p.overflow * p.psize, b"\x00", f"{p.overflow}"),
    "overflow-flags": lambda p: (p.flags(p.overflow), b"\x02", f"{p.overflow}"),
    "overflow-run": lambda p: (p.flags(p.overflow) + 2, b"\x01\x00\x00\x00", f"{p.overflow}"),
    "overflow-run-long": lambda p: (p.flags(p.overflow) + 4, b"\x01", f"{p.overflow}"),
    # Whole pages zeroed.
    "zeroed-leaf": lambda p: (p.leaf * p.psize, bytes(p.psize), f"{p.leaf}"),
    "zeroed-root": lambda p: (p.root * p.psize, bytes(p.psize), f"{p.root}"),
    "zeroed-meta": lambda p: (0, bytes(p.psize), "0"),
}


def _damage(data: Path, lib: int, case: str) -> tuple[str, _Pages]:
    pages = _Pages(data, lib)
    at, new, page = CASES[case](pages)
    assert pages.raw[at : at + len(new)] != new, "the case changes the file"
    with open(data, "r+b") as f:
        f.seek(at)
        f.write(new)
    return page, pages


def _pattern(data: Path, page: str) -> str:
    damaged = r"(damaged LMDB database: |not an LMDB database.*)"
    return rf"(^|error: ){re.escape(str(data))}: {damaged}page {page}\b"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_garbled_database_is_one_error_naming_the_page(tmp_path: Path, case: str) -> None:
    # Through the command, with two workers: no signal, one error line, nothing published.
    data = _write(tmp_path / "db")
    page, _ = _damage(data, 0, case)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "shardstream", "import", "lmdb", str(tmp_path / "db")]
    command += ["--output", str(out), "--workers", "2", "--no-progress"]
    run = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, (run.returncode, run.stderr)  # a signal is negative
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.search(_pattern(data, page), lines[0]), lines[0]
    assert not (out / "index.json").exists()
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_garbled_lmdb_1_0_database_is_one_error_naming_the_page(
    tmp_path: Path, case: str
) -> None:
    # The layout of LMDB 1.0 (py-lmdb reads both): 24-byte headers, node offsets from
    # the header's end. The check is pure Python, so it runs in this process.
    data = _write(tmp_path / "db", lib=1)
    page, _ = _damage(data, 1, case)
    with pytest.raises(InputError, match=_pattern(data, page)) as info:
        check(str(tmp_path / "db"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("keep", [100, 4096 + 1000, 0.7])
def test_a_cut_file_is_one_error(tmp_path: Path, keep: float) -> None:
    data = _write(tmp_path / "db")
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(int(keep * size) if keep < 1 else int(keep))
    config = ImportConfig(
        format="lmdb", inputs=(str(tmp_path / "db"),), output=str(tmp_path / "o"), **SMALL
    )
    with pytest.raises(InputError, match=r"data\.mdb: (truncated LMDB database|not an LMDB data)"):
        build_import(config)
    assert not (tmp_path / "o" / "index.json").exists()


def _churn(folder: Path, lib: int) -> None:
    """Deletes and overwrites over many transactions: free pages, reused pages, values
    overwritten in place on longer overflow runs than they need."""
    env = lmdb.open(str(folder), map_size=1 << 28, lib_version=lib)
    rng = random.Random(1)
    for _ in range(12):
        with env.begin(write=True) as txn:
            for _ in range(500):
                key = b"k%05d" % rng.randrange(4000)
                if rng.random() < 0.3:
                    txn.delete(key)
                else:
                    txn.put(key, os.urandom(rng.choice([0, 5, 100, 1500, 4000, 9000, 30000])))
    env.close()


def _empty(folder: Path, lib: int) -> None:
    lmdb.open(str(folder), map_size=1 << 20, lib_version=lib).close()


def _emptied(folder: Path, lib: int) -> None:
    env = lmdb.open(str(folder), map_size=1 << 24, lib_version=lib)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"%d" % i, b"x" * (i * 20))
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.delete(b"%d" % i)
    env.close()


def _named(folder: Path, lib: int) -> None:
    """Named databases: their records are values of the main database."""
    env = lmdb.open(str(folder), map_size=1 << 24, max_dbs=2, lib_version=lib)
    a, b = env.open_db(b"a"), env.open_db(b"b", dupsort=True)
    with env.begin(write=True) as txn:
        for i in range(500):
            txn.put(b"%d" % i, b"v" * (i % 50), db=a)
            txn.put(b"%d" % (i % 20), b"%d" % i, db=b)
        txn.put(b"plain", b"value")
    env.close()


def _dupsort_main(folder: Path, lib: int, dupfixed: bool = False) -> None:
    """A main database of sorted duplicates (py-lmdb cannot open one so, a C writer can):
    a named DUPSORT database's record written over the meta page's main database. Keys
    with a few duplicates keep them on an inline sub-page, keys with many in a
    sub-database."""
    env = lmdb.open(str(folder), map_size=1 << 26, max_dbs=2, lib_version=lib)
    dups = env.open_db(b"d", dupsort=True, dupfixed=dupfixed)
    with env.begin(write=True) as txn:
        for i in range(200):
            for j in range(1 if i % 3 else 3 if i % 2 else 600):
                txn.put(b"k%04d" % i, b"%08d" % j, db=dups)
    with env.begin() as txn:
        record = txn.get(b"d")
    env.close()
    meta, _ = lmdb_pages.newest_meta(str(folder))
    with open(folder / "data.mdb", "r+b") as f:
        f.seek(meta.page * meta.psize + meta.layout.header + 24 + 48)
        f.write(record)


VALID = {
    "churn": _churn,
    "empty": _empty,
    "emptied": _emptied,
    "named": _named,
}


@pytest.mark.parametrize("lib", [0, 1])
@pytest.mark.parametrize("kind", sorted(VALID))
def test_databases_lmdb_writes_pass_and_import_whole(tmp_path: Path, kind: str, lib: int) -> None:
    VALID[kind](tmp_path / "db", lib)
    _passes_and_imports_whole(tmp_path)


@pytest.mark.parametrize("dupfixed", [False, True])
def test_a_main_database_of_sorted_duplicates_passes(tmp_path: Path, dupfixed: bool) -> None:
    _dupsort_main(tmp_path / "db", 0, dupfixed)
    _passes_and_imports_whole(tmp_path)


def _passes_and_imports_whole(tmp_path: Path) -> None:
    check(str(tmp_path / "db"))
    env = lmdb.open(str(tmp_path / "db"), readonly=True, lock=False)
    with env.begin() as txn:
        want = list(txn.cursor())
    env.close()
    if not want:
        return  # nothing to import: the import refuses an empty source on its own
    out = tmp_path / "out"
    config = ImportConfig(format="lmdb", inputs=(str(tmp_path / "db"),), output=str(out),
                          part_bytes=50_000, workers=2, **SMALL)  # fmt: skip
    assert build_import(config).samples == len(want)
    got = read_with_ours(out)
    assert [(s["key"], s["value"]) for s in got] == want


def test_a_database_changed_after_its_check_is_refused(tmp_path: Path) -> None:
    from shardstream.shard_builder.importers import lmdb as lmdb_format

    _write(tmp_path / "db")
    (unit,) = lmdb_format.plan((str(tmp_path / "db"),))
    os.utime(tmp_path / "db" / "data.mdb", ns=(unit.mtime_ns + 10**9, unit.mtime_ns + 10**9))
    with pytest.raises(InputError, match=r"data\.mdb: the LMDB database changed"):
        next(lmdb_format.read(unit))
    shutil.rmtree(tmp_path / "db")
