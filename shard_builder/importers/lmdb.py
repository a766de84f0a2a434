"""LMDB databases: each entry becomes ``{key: bytes, value: ...}``, in key order.

``value_format`` says how values are stored: ``raw`` (bytes as they are), ``json`` (parsed
JSON), ``npy`` (a ``.npy`` array, loaded without pickle) or ``pickle``. Pickled values are
unpickled only when the user passed ``--allow-pickle`` (the config refuses ``pickle``
otherwise: a pickle runs whatever code it holds); each one must be bytes, str, int, float,
a numpy array, or JSON-like (dict, list, None), which become ``bytes``, ``str``, ``int``,
``float64``, ``ndarray`` and ``json`` columns. A source is an LMDB folder (with
``data.mdb``) or a ``.mdb`` file; a value that does not parse is one error naming the
database and key.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from collections.abc import Iterator

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

    subdir = os.path.isdir(unit.path)
    try:
        env = lmdb.open(unit.path, readonly=True, lock=False, subdir=subdir, readahead=False)
    except lmdb.Error as exc:
        raise InputError(f"{unit.path}: cannot open the LMDB database ({exc})") from exc
    try:
        with env.begin(buffers=False) as txn:
            for key, value in txn.cursor():
                where = f"{unit.path} key {key!r}"
                yield (
                    where,
                    {"key": ("bytes", bytes(key)), "value": _value(unit.option, value, where)},
                )
    except lmdb.Error as exc:
        raise InputError(f"{unit.path}: damaged LMDB database ({exc})") from exc
    finally:
        env.close()


FORMAT = ImportFormat("lmdb", plan, read)
