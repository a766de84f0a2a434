"""LMDB databases: each entry becomes ``{key: bytes, value: ...}``, in key order.

``value_format`` says how values are stored: ``raw`` (bytes as they are), ``json`` (parsed
JSON), ``npy`` (a ``.npy`` array, loaded without pickle) or ``pickle``. Pickled values are
unpickled only when the user passed ``--allow-pickle`` (the config refuses ``pickle``
otherwise: a pickle runs whatever code it holds); each one must be bytes, str, int, float,
a numpy array, or JSON-like (dict, list, None), which become ``bytes``, ``str``, ``int``,
``float64``, ``ndarray`` and ``json`` columns. A source is an LMDB folder (with
``data.mdb``) or a ``.mdb`` file; a value that does not parse is one error naming the
database and key. A big database is split into key ranges (every N-th key, from one scan
of the keys alone), read by several workers at once.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import pickle
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import Column, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.importers.values import column_of

VALUE_FORMATS = ("raw", "json", "npy", "pickle")


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    units: list[SourceUnit] = []
    for arg in inputs:
        path = os.path.abspath(arg)
        data = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
        try:
            st = os.stat(data)
        except OSError as exc:
            raise InputError(f"{arg}: not an LMDB database (no {data}: {exc.strerror})") from exc
        units.append(SourceUnit(path, st.st_size, st.st_mtime_ns))
    return units


def _open(path: str) -> Any:
    import lmdb

    try:
        return lmdb.open(
            path, readonly=True, lock=False, subdir=os.path.isdir(path), readahead=False
        )
    except lmdb.Error as exc:
        raise InputError(f"{path}: cannot open the LMDB database ({exc})") from exc


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as key ranges ``span = (first key, entries)`` of about ``part_bytes`` each."""
    import lmdb

    env = _open(unit.path)
    try:
        entries = int(env.stat()["entries"])
        per_part = max(1, part_bytes * entries // max(unit.nbytes, 1))
        if entries <= per_part:
            return [unit]
        with env.begin() as txn:
            # Keys only: a scan of the B-tree's leaf pages, never of the values.
            firsts = [
                bytes(key)
                for i, key in enumerate(txn.cursor().iternext(keys=True, values=False))
                if i % per_part == 0
            ]
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
            return "ndarray", np.load(io.BytesIO(data), allow_pickle=False)
        if fmt == "pickle":  # the config allows it only with --allow-pickle
            try:
                value = pickle.loads(data)
            except Exception as exc:  # a pickle can fail in any way (missing classes, ...)
                raise InputError(f"{where}: the value does not unpickle ({exc!r})") from exc
            return column_of(value, where, "unpickled value")
    except (ValueError, UnicodeDecodeError, EOFError) as exc:
        raise InputError(f"{where}: the value is not {fmt} ({exc})") from exc
    return "bytes", data


def read(unit: SourceUnit) -> Iterator[Record]:
    import lmdb

    env = _open(unit.path)
    fmt = unit.option
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            if unit.span:
                first, count = unit.span
                entries = itertools.islice(cursor if cursor.set_range(first) else (), count)
            else:
                entries = iter(cursor)
            for key, value in entries:
                where = f"{unit.path} key {key!r}"
                column = ("bytes", value) if fmt == "raw" else _value(fmt, value, where)
                yield where, {"key": ("bytes", key), "value": column}
    except lmdb.Error as exc:
        raise InputError(f"{unit.path}: damaged LMDB database ({exc})") from exc
    finally:
        env.close()


FORMAT = ImportFormat("lmdb", plan, read, split=split)
