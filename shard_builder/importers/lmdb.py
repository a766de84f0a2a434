"""LMDB databases: each entry becomes ``{key: bytes, value: ...}``, in key order.

``value_format`` says how values are stored: ``raw`` (bytes as they are), ``json`` (parsed
JSON), ``npy`` (a ``.npy`` array, loaded without pickle) or ``pickle``. Pickled values are
unpickled only when the user passed ``--allow-pickle`` (the config refuses ``pickle``
otherwise: a pickle runs whatever code it holds); each one must be bytes, str, int, float,
a numpy array, or JSON-like (dict, list, None), which become ``bytes``, ``str``, ``int``,
``float64``, ``ndarray`` and ``json`` columns. A source is an LMDB folder (with
``data.mdb``) or a ``.mdb`` file; a value that does not parse is one error naming the
database and key. A big database is split into key ranges (every N-th key, from one scan
of the keys alone), read by several workers at once. Before liblmdb reads a database its
pages are checked from Python (:mod:`.lmdb_pages`): a garbled or cut file is one error
naming the file and the page, never a worker killed by SIGBUS or SIGSEGV.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle
from collections.abc import Iterator
from dataclasses import replace
from operator import itemgetter
from typing import Any

from shardstream.errors import InputError
from shardstream.shard_builder.importers.columnar import BATCH_RECORDS
from shardstream.shard_builder.importers.lmdb_pages import (
    MDB_DUPSORT,
    check,
    check_size,
    data_file,
    newest_meta,
)
from shardstream.shard_builder.importers.npy import load_npy
from shardstream.shard_builder.importers.source import (
    Batch,
    Column,
    ImportFormat,
    Record,
    SourceUnit,
)
from shardstream.shard_builder.importers.values import column_of

VALUE_FORMATS = ("raw", "json", "npy", "pickle")


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    """One unit per database, each checked whole (:func:`.lmdb_pages.check`) before
    liblmdb reads it anywhere."""
    units: list[SourceUnit] = []
    for arg in inputs:
        path = os.path.abspath(arg)
        data = data_file(path)
        try:
            st = os.stat(data)
        except OSError as exc:
            raise InputError(f"{arg}: not an LMDB database (no {data}: {exc.strerror})") from exc
        check(path)
        units.append(SourceUnit(path, st.st_size, st.st_mtime_ns))
    return units


def _open(unit: SourceUnit) -> Any:
    """The database, read-only, with the kernel's readahead: entries are read in key order,
    and without readahead every 4 KiB page of a cold file is a disk read of its own (a cold
    import of 160 MB took 5.3 s instead of 0.6 s). The key scan of :func:`split` wants it
    too: LMDB reads the first page of every big value beside its key.

    :func:`plan` checked the whole file; a file changed since is refused rather than
    handed to liblmdb unchecked (the length is checked again, cheaply, in any case)."""
    import lmdb

    path = unit.path
    check_size(path)
    if unit.mtime_ns and os.stat(data_file(path)).st_mtime_ns != unit.mtime_ns:
        raise InputError(
            f"{data_file(path)}: the LMDB database changed while it was imported (run the "
            "import again once nothing writes to it)"
        )
    try:
        return lmdb.open(
            path, readonly=True, lock=False, subdir=os.path.isdir(path), readahead=True
        )
    except lmdb.Error as exc:
        raise InputError(f"{path}: cannot open the LMDB database ({exc})") from exc


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as key ranges ``span = (first key, entries)`` of about ``part_bytes`` each.

    A main database of sorted duplicates (``MDB_DUPSORT``, written by C programs) stays
    whole: a range starting inside one key's duplicates would start at its first one."""
    import lmdb

    if newest_meta(unit.path)[0].main.flags & MDB_DUPSORT:
        return [unit]
    env = _open(unit)
    try:
        stat = env.stat()
        entries = int(stat["entries"])
        # The pages in use, not the file's size: an LMDB file keeps its free pages.
        used = stat["psize"] * (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"])
        per_part = max(1, part_bytes * entries // max(min(used, unit.nbytes), 1))
        if entries <= per_part:
            return [unit]
        with env.begin() as txn:
            # Keys only: a scan of the B-tree's leaf pages, never of the values; every
            # per_part-th key is picked in C.
            keys = txn.cursor().iternext(keys=True, values=False)
            firsts = list(itertools.islice(keys, 0, None, per_part))
    except lmdb.Error as exc:
        raise InputError(f"{unit.path}: damaged LMDB database ({exc})") from exc
    finally:
        env.close()
    parts = []
    for i, first in enumerate(firsts):
        count = min(per_part, entries - i * per_part)
        share = unit.nbytes * count // entries
        parts.append(replace(unit, nbytes=share, span=(first, count), first=i * per_part))
    # The shares' rounding goes to the last part, so the parts add up to the file.
    rest = unit.nbytes - sum(p.nbytes for p in parts)
    parts[-1] = replace(parts[-1], nbytes=parts[-1].nbytes + rest)
    return parts


def _value(fmt: str, data: bytes, where: str) -> Column:
    try:
        if fmt == "json":
            return "json", json.loads(data)
        if fmt == "npy":
            return "ndarray", load_npy(data)
        if fmt == "pickle":  # the config allows it only with --allow-pickle
            try:
                value = pickle.loads(data)
            except Exception as exc:  # a pickle can fail in any way (missing classes, ...)
                raise InputError(f"{where}: the value does not unpickle ({exc!r})") from exc
            return column_of(value, where, "unpickled value")
    except (ValueError, EOFError, RecursionError) as exc:  # Recursion: JSON nested too deeply
        raise InputError(f"{where}: the value is not {fmt} ({exc})") from exc
    return "bytes", data


def _entries(unit: SourceUnit, views: bool = False) -> Iterator[list[tuple[Any, Any]]]:
    """The unit's ``(key, value)`` entries in key order, in lists of ``BATCH_RECORDS``:
    ``bytes``, or with ``views`` ``memoryview`` s of the database's pages (no copy; valid
    until the next list is read)."""
    import lmdb

    env = _open(unit)
    try:
        with env.begin(buffers=views) as txn:
            cursor = txn.cursor()
            if unit.span:
                first, count = unit.span
                entries = itertools.islice(cursor if cursor.set_range(first) else (), count)
            else:
                entries = iter(cursor)
            while chunk := list(itertools.islice(entries, BATCH_RECORDS)):
                yield chunk
    except lmdb.Error as exc:
        raise InputError(f"{unit.path}: damaged LMDB database ({exc})") from exc
    finally:
        env.close()


def _where(path: str, key: bytes) -> str:
    return f"{path} key {key!r}"


def read(unit: SourceUnit) -> Iterator[Record]:
    fmt = unit.option
    for chunk in _entries(unit):
        for key, value in chunk:
            where = _where(unit.path, key)
            column = ("bytes", value) if fmt == "raw" else _value(fmt, value, where)
            yield where, {"key": ("bytes", key), "value": column}


def read_batches(unit: SourceUnit) -> Iterator[Batch]:
    """The records of :func:`read`, a batch per ``BATCH_RECORDS`` entries: raw keys and
    values as views of the database's pages (no per-entry Python at all, and no copy
    before the batch's encoded bytes are joined), parsed values as a column where they
    share an encoding."""
    fmt, path = unit.option, unit.path
    for chunk in _entries(unit, views=fmt == "raw"):
        keys = list(map(itemgetter(0), chunk))
        values = list(map(itemgetter(1), chunk))
        where = functools.partial(_nth_where, path, keys)
        if fmt == "raw":
            yield Batch(len(chunk), where, {"key": ("bytes", keys), "value": ("bytes", values)})
            continue
        cells = [_value(fmt, value, where(i)) for i, value in enumerate(values)]
        encodings = set(map(itemgetter(0), cells))
        if len(encodings) == 1:
            columns = {"key": ("bytes", keys), "value": (encodings.pop(), [v for _, v in cells])}
            yield Batch(len(chunk), where, columns)
        else:
            rows = [
                (where(i), {"key": ("bytes", k), "value": c})
                for i, (k, c) in enumerate(zip(keys, cells, strict=True))
            ]
            yield Batch(len(chunk), where, rows=rows)


def _nth_where(path: str, keys: list[Any], i: int) -> str:
    return _where(path, bytes(keys[i]))


FORMAT = ImportFormat("lmdb", plan, read, split=split, read_batches=read_batches)
