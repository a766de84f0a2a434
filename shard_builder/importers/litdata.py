"""LitData optimized datasets (``litdata.optimize`` output): general items and token chunks.

A source is an optimized folder (its ``index.json`` lists the chunks) or an ``s3://``
prefix, which is copied to a local folder first (with the store's own verified downloads).
Items are read with LitData's own ``StreamingDataset`` in order (``shuffle=False``), so the
samples are exactly what a LitData user trains on:

* **General items** (``PyTreeLoader``): a dict becomes one column per key; a single value
  one column ``value``. ``int`` -> ``int``, ``float`` -> ``float64``, ``str`` -> ``str``,
  ``bytes`` -> ``bytes``, numpy arrays and torch tensors -> ``ndarray``, lists, dicts and
  ``None`` -> ``json``; any other type (e.g. a decoded image) is one error naming the item.
* **Token chunks** (``TokensLoader``): LitData cuts the token stream into blocks of the
  ``block_size`` the reader asks for, which the folder does not record; ``--seq-len N``
  gives it. Each block becomes a ``tokens`` sample of ``ndarray:<dtype>:N``, the layout
  ``shardstream build text`` writes, so the token path reads it without re-tokenizing.

A folder is split into item ranges of about ``part_bytes`` (small chunks grouped, big ones
cut), read by several workers at once; each reads its items by index, as LitData does.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.columnar import BATCH_RECORDS
from shardstream.shard_builder.importers.source import Batch, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.importers.values import PLAIN_TYPES, column_of, columns_of

_COPIES: dict[str, str] = {}  # s3:// prefix -> local copy (one per process)


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    units = []
    for arg in inputs:
        folder = _local(arg)
        index = Path(folder) / "index.json"
        try:
            meta = json.loads(index.read_text())
            chunks = meta["chunks"]
            loader = meta["config"].get("item_loader")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{arg}: not a LitData optimized folder ({index}: {exc})") from exc
        if loader == "TokensLoader" and not option:
            raise InputError(
                f"{arg}: a LitData token dataset (TokensLoader) does not record its block "
                "size; give --seq-len N, the block_size your training reads it with"
            )
        if loader not in ("TokensLoader", "PyTreeLoader", None):
            raise InputError(f"{arg}: LitData item loader {loader!r} is not supported")
        size = sum(int(c.get("chunk_bytes", 0)) for c in chunks)
        units.append(SourceUnit(arg, size, int(index.stat().st_mtime_ns)))
    return units


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as item ranges ``span = (first item, end item)`` of about ``part_bytes``."""
    meta = json.loads((Path(_local(unit.path)) / "index.json").read_text())
    tokens = meta["config"].get("item_loader") == "TokensLoader"
    parts: list[SourceUnit] = []
    first = end = held = 0  # the part being filled: items [first, end), about held bytes

    def emit() -> None:
        nonlocal first, held
        if end > first:
            parts.append(replace(unit, nbytes=held, span=(first, end), first=first))
        first, held = end, 0

    for chunk in meta["chunks"]:
        # LitData's own item count per chunk (its loaders' generate_intervals).
        items = int(chunk["dim"]) // int(unit.option) if tokens else int(chunk["chunk_size"])
        nbytes = int(chunk.get("chunk_bytes", 0))
        done = 0
        while done < items:
            fit = -(-(part_bytes - held) * items // max(nbytes, 1))  # items that fill the part
            take = min(items - done, max(1, fit))
            # The chunk's bytes shared out by item count (the shares add up to the chunk).
            held += nbytes * (done + take) // items - nbytes * done // items
            done, end = done + take, end + take
            if held >= part_bytes:
                emit()
    emit()
    return parts if len(parts) > 1 else [unit]


def _local(source: str) -> str:
    """A local folder holding ``source`` (an ``s3://`` prefix is copied once)."""
    if "://" not in source:
        return os.path.abspath(source)
    if source not in _COPIES:
        from shardstream.storage import open_store

        store = open_store(source)
        dest = Path(tempfile.mkdtemp(prefix="shardstream-litdata-"))
        for key, size in store.list(""):
            if "/" in key.strip("/"):
                continue  # the optimized folder is flat
            store.download(key, dest / key, expected_size=size)
        _COPIES[source] = str(dest)
    return _COPIES[source]


def _open(unit: SourceUnit) -> tuple[Any, int]:
    """LitData's ``StreamingDataset`` over the unit's folder (items in order), and the
    token block size (0: general items)."""
    from litdata import StreamingDataset, TokensLoader

    logging.getLogger("litdata").setLevel(logging.WARNING)  # not one INFO line per open

    folder = _local(unit.path)
    meta = json.loads((Path(folder) / "index.json").read_text())
    seq_len = int(unit.option) if meta["config"].get("item_loader") == "TokensLoader" else 0
    try:
        if seq_len:
            return StreamingDataset(folder, item_loader=TokensLoader(block_size=seq_len)), seq_len
        return StreamingDataset(folder, shuffle=False), 0
    except Exception as exc:  # LitData raises its own and plain errors alike
        raise InputError(f"{unit.path}: LitData cannot open the dataset ({exc})") from exc


def _items(unit: SourceUnit) -> Iterator[tuple[int, list[Any], int]]:
    """``(first item number, items, seq_len)``: the unit's items in lists of
    ``BATCH_RECORDS``, read with LitData in order."""
    ds, seq_len = _open(unit)
    first, end = unit.span or (0, len(ds))
    for start in range(first, end, BATCH_RECORDS):
        items = []
        for i in range(start, min(end, start + BATCH_RECORDS)):
            try:
                items.append(ds[i])
            except Exception as exc:
                raise InputError(f"{unit.path} item {i}: LitData cannot read it ({exc})") from exc
        yield start, items, seq_len


def _record(where: str, item: Any, seq_len: int) -> Record:
    if seq_len:
        arr = _array(item)
        return where, {"tokens": (f"ndarray:{arr.dtype.name}:{seq_len}", arr)}
    if isinstance(item, dict):
        return where, columns_of(item, where)
    return where, {"value": column_of(item, where)}


def read(unit: SourceUnit) -> Iterator[Record]:
    for start, items, seq_len in _items(unit):
        for i, item in enumerate(items, start):
            yield _record(f"{unit.path} item {i}", item, seq_len)


def read_batches(unit: SourceUnit) -> Iterator[Batch]:
    """The records of :func:`read`, a batch per ``BATCH_RECORDS`` items: columnar when the
    items are dicts with the same keys whose values have one plain type per key (or token
    blocks of one dtype), else as rows."""
    for start, items, seq_len in _items(unit):
        where = functools.partial(_nth_where, unit.path, start)
        columns = _token_columns(items, seq_len) if seq_len else _item_columns(items)
        if columns is not None:
            yield Batch(len(items), where, columns)
        else:
            rows = [_record(where(i), item, seq_len) for i, item in enumerate(items)]
            yield Batch(len(items), where, rows=rows)


def _nth_where(path: str, start: int, i: int) -> str:
    return f"{path} item {start + i}"


def _plain(values: list[Any]) -> str | None:
    """The column encoding of ``values`` when all have one plain type."""
    types = set(map(type, values))
    if len(types) != 1:
        return None
    kind = types.pop()
    return "ndarray" if kind is np.ndarray else PLAIN_TYPES.get(kind)


def _item_columns(items: list[Any]) -> dict[str, tuple[str, Sequence[Any]]] | None:
    """``items`` as columns, or ``None`` when a value needs :func:`column_of`'s conversion
    (or its error, which :func:`read` raises for the first such item in order)."""
    if set(map(type, items)) != {dict}:
        encoding = _plain(items)
        return None if encoding is None else {"value": (encoding, items)}
    layouts = set(map(tuple, items))
    if len(layouts) != 1:
        return None
    keys = layouts.pop()
    if len({str(key) for key in keys}) != len(keys):
        return None  # keys that are one column name (1 and "1"): as read does it
    columns: dict[str, tuple[str, Sequence[Any]]] = {}
    for key in keys:
        values = list(map(itemgetter(key), items))
        encoding = _plain(values)
        if encoding is None:
            return None
        columns[str(key)] = (encoding, values)
    return columns


def _token_columns(items: list[Any], seq_len: int) -> dict[str, tuple[str, Sequence[Any]]] | None:
    arrays = list(map(_array, items))
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1 or {a.shape for a in arrays} != {(seq_len,)}:
        return None
    return {"tokens": (f"ndarray:{dtypes.pop().name}:{seq_len}", np.stack(arrays))}


def _array(value: Any) -> np.ndarray[Any, Any]:
    if hasattr(value, "numpy"):  # a torch tensor
        return np.asarray(value.numpy())
    return np.asarray(value)


FORMAT = ImportFormat("litdata", plan, read, split=split, read_batches=read_batches)
