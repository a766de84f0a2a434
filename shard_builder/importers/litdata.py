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

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import ImportFormat, Record, SourceUnit
from shardstream.shard_builder.importers.values import column_of, columns_of

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


def read(unit: SourceUnit) -> Iterator[Record]:
    from litdata import StreamingDataset, TokensLoader

    logging.getLogger("litdata").setLevel(logging.WARNING)  # not one INFO line per open

    folder = _local(unit.path)
    meta = json.loads((Path(folder) / "index.json").read_text())
    tokens = meta["config"].get("item_loader") == "TokensLoader"
    try:
        if tokens:
            seq_len = int(unit.option)
            ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=seq_len))
        else:
            ds = StreamingDataset(folder, shuffle=False)
    except Exception as exc:  # LitData raises its own and plain errors alike
        raise InputError(f"{unit.path}: LitData cannot open the dataset ({exc})") from exc
    first, end = unit.span or (0, len(ds))
    for i in range(first, end):
        where = f"{unit.path} item {i}"
        try:
            item = ds[i]
        except Exception as exc:
            raise InputError(f"{where}: LitData cannot read it ({exc})") from exc
        if tokens:
            arr = _array(item)
            yield where, {"tokens": (f"ndarray:{arr.dtype.name}:{seq_len}", arr)}
        elif isinstance(item, dict):
            yield where, columns_of(item, where)
        else:
            yield where, {"value": column_of(item, where)}


def _array(value: Any) -> np.ndarray[Any, Any]:
    if hasattr(value, "numpy"):  # a torch tensor
        return np.asarray(value.numpy())
    return np.asarray(value)


FORMAT = ImportFormat("litdata", plan, read, split=split)
