"""A LitData folder's ``index.json``: its chunks, and the layout of its items.

``index.json`` (``BinaryWriter``) lists the chunk files in item order with their item
counts (``chunk_size``), bytes (``chunk_bytes``) and, for token chunks, token counts
(``dim``); its ``config`` says how the items were written: the item loader, each leaf's
serializer (``data_format``), the tree of leaves (``data_spec``) and any compression or
encryption. It is the only file planning and splitting read, and a worker reads it once per
process (a big folder's index is megabytes), for a remote folder through the store.
"""

from __future__ import annotations

import array
import decimal
import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter, methodcaller
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.errors import InputError, ObjectNotFoundError
from shardstream.shard_builder.importers.json_stream import load_streaming
from shardstream.shard_builder.importers.source import SourceUnit
from shardstream.shard_builder.inputs import names_inside, plain_names
from shardstream.shard_builder.progress import planning_bar
from shardstream.storage import ObjectStore, open_store

SCALARS = frozenset({"bytes", "str", "int", "float", "bool"})
# LitData's dtype codes (litdata.constants) as numpy dtypes. Object, string and bfloat16
# (torch's 10) data have none here: they are left to LitData.
_NUMPY = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?"]
_TORCH = ["f4", "f4", "f8", "f8", "c8", "c8", "c16", "c16", "f2", "f2", ""]
_TORCH += ["u1", "i1", "i2", "i2", "i4", "i4", "i8", "i8", "?", "u2"]
NUMPY_CODES = {code: np.dtype(name) for code, name in enumerate(_NUMPY)}
TORCH_CODES = {code: np.dtype(name) for code, name in enumerate(_TORCH) if name}
_INDEXES: dict[tuple[str, int], LitIndex] = {}  # (source, mtime_ns) -> index, this process's
_KEPT_INDEXES = 8
BIG_INDEX = 8 << 20  # chars of an index.json (about 100,000 chunks) read with a progress bar


@dataclass(frozen=True)
class LitIndex:
    """A LitData folder's ``index.json``: its config and its chunks' files and sizes."""

    source: str  # the folder (absolute path) or its URL
    config: dict[str, Any]
    names: tuple[str, ...]  # chunk files, in item order
    items: np.ndarray[Any, Any]  # items per chunk (``chunk_size``)
    dims: np.ndarray[Any, Any]  # tokens per chunk (-1: not recorded)
    sizes: np.ndarray[Any, Any]  # bytes per chunk (``chunk_bytes``; 0: not recorded)
    mtime_ns: int  # when the index was written
    store: ObjectStore | None = None  # a remote folder's store

    _bounds: dict[int, np.ndarray[Any, Any]] = field(default_factory=dict, compare=False)

    def counts(self, seq_len: int) -> np.ndarray[Any, Any]:
        """Items per chunk as LitData's loaders count them (``generate_intervals``): a token
        folder read in blocks of ``seq_len`` has ``dim // seq_len`` per chunk."""
        return self.dims // seq_len if seq_len else self.items

    def pieces(self, seq_len: int, span: tuple[Any, ...]) -> Iterator[tuple[int, int, int, int]]:
        """``(chunk, its first item, lo, hi)`` for each chunk holding some of the items
        ``span = (first, end)`` (``()``: all), which are its items ``lo .. hi - 1``."""
        bounds = self._bounds.get(seq_len)
        if bounds is None:  # kept: a part of a folder of many chunks looks up only its own
            bounds = self._bounds[seq_len] = np.concatenate([[0], np.cumsum(self.counts(seq_len))])
        first, end = span or (0, int(bounds[-1]))
        c = int(np.searchsorted(bounds, first, "right")) - 1
        while c < len(self.names) and bounds[c] < end:
            base = int(bounds[c])
            lo, hi = max(first, base) - base, min(end, int(bounds[c + 1])) - base
            if lo < hi:
                yield c, base, lo, hi
            c += 1


def read_index(source: str) -> LitIndex:
    """``source``'s ``index.json`` (only that file of a remote folder is read).

    The chunk list is parsed one entry at a time (:mod:`.json_stream`) into arrays, with a
    progress bar for a big one while the build plans; the chunk names are checked in bulk
    (:func:`~shardstream.shard_builder.inputs.names_inside`): a million chunks take seconds
    and a few hundred megabytes, not minutes and gigabytes."""
    store = store_of(source) if "://" in source else None
    path = f"{source.rstrip('/')}/index.json" if store else os.path.abspath(source) + "/index.json"
    try:
        raw = store.read_bytes("index.json") if store else Path(path).read_bytes()
        text = raw.decode("utf-8")
        del raw
        chunks = _Chunks()
        with planning_bar(len(text), "read index.json", long=len(text) >= BIG_INDEX) as bar:
            meta = load_streaming(text, "chunks", chunks.take, lambda at: bar.update(at - bar.n))
        del text
        if "chunks" not in meta:
            raise KeyError("chunks")
        if not plain_names(chunks.names):
            raise ValueError("a chunk file name is not a plain file name")
        index = LitIndex(
            source if store else os.path.abspath(source),
            dict(meta["config"]),
            tuple(chunks.names),
            np.array(chunks.items, np.int64),
            np.array(chunks.dims, np.int64),
            np.array(chunks.sizes, np.int64),
            # A remote folder's stamp is the one LitData writes (an object has no mtime).
            _stamp(meta.get("updated_at")) if store else Path(path).stat().st_mtime_ns,
            store,
        )
    except (
        *(ObjectNotFoundError, OSError, ValueError, KeyError, TypeError, AttributeError),
        OverflowError,  # a count past int64
    ) as exc:
        raise InputError(f"{source}: not a LitData optimized folder ({path}: {exc})") from exc
    if (index.items < 0).any() or (index.sizes < 0).any() or (index.dims < -1).any():
        raise InputError(f"{path}: a chunk with a negative chunk_size, chunk_bytes or dim")
    if store is None:  # no chunk read through a symlink that leads out
        names_inside(index.source, index.names, "LitData chunk")
    if len(_INDEXES) >= _KEPT_INDEXES:
        _INDEXES.pop(next(iter(_INDEXES)))
    _INDEXES[(source, index.mtime_ns)] = index
    return index


class _Chunks:
    """The fields of each ``index.json`` chunk entry, kept as the entries are parsed, a
    list of entries at a time (the counts as int64 arrays, which refuse a count past 64
    bits)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.items = array.array("q")  # chunk_size
        self.dims = array.array("q")  # dim (-1: none)
        self.sizes = array.array("q")  # chunk_bytes (0: none)

    def take(self, chunks: list[Any]) -> None:
        self.names.extend(map(str, map(itemgetter("filename"), chunks)))
        self.items.extend(map(int, map(itemgetter("chunk_size"), chunks)))
        dims = list(map(methodcaller("get", "dim"), chunks))
        self.dims.extend([-1 if dim is None else int(dim) for dim in dims])
        self.sizes.extend([int(c.get("chunk_bytes") or 0) for c in chunks])


def index_of(unit: SourceUnit) -> LitIndex:
    """The unit's folder's index, read once per process (a big folder's is megabytes)."""
    index = _INDEXES.get((unit.path, unit.mtime_ns))
    return index if index is not None else read_index(unit.path)


@functools.lru_cache(maxsize=8)
def store_of(source: str) -> ObjectStore:
    """The store of a remote folder, one per process (its clients and connections)."""
    return open_store(source)


def _stamp(updated_at: Any) -> int:
    """LitData's ``updated_at`` (seconds, as text) in nanoseconds; 0 if there is none."""
    try:
        return int(decimal.Decimal(str(updated_at)) * 1_000_000_000)
    except (ArithmeticError, ValueError):  # decimal.InvalidOperation is an ArithmeticError
        return 0


@dataclass(frozen=True)
class Layout:
    """What the direct reader reads: ``(column, data_format)`` per leaf; for a token folder
    the tokens' dtype and block size."""

    leaves: tuple[tuple[str, str], ...]
    tokens: np.dtype[Any] | None = None
    seq_len: int = 0


def layout_of(index: LitIndex, seq_len: int) -> Layout | None:
    """The folder's :class:`Layout`, or ``None`` where LitData has to read it."""
    config = index.config
    wrapped = ("compression", "compression_level", "encryption", "ipc_compression", "format")
    if any(config.get(key) for key in wrapped):
        return None
    formats = config.get("data_format")
    if not formats or not isinstance(formats, list) or not all(type(f) is str for f in formats):
        return None
    if config.get("item_loader") == "TokensLoader":
        dtype = flat_dtype(formats[0]) if len(formats) == 1 else None
        return None if dtype is None else Layout((("tokens", formats[0]),), dtype, seq_len)
    names = _leaf_names(config.get("data_spec"))
    if names is None or len(names) != len(formats):
        return None
    known = SCALARS | {"numpy", "tensor"}
    if not all(f in known or flat_dtype(f) is not None for f in formats):
        return None
    return Layout(tuple(zip(names, formats, strict=True)))


def flat_dtype(data_format: str) -> np.dtype[Any] | None:
    """The dtype of a ``no_header_numpy:N`` or ``no_header_tensor:N`` leaf (``None``: another
    serializer, or a dtype numpy has not)."""
    kind, _, code = data_format.partition(":")
    codes = {"no_header_numpy": NUMPY_CODES, "no_header_tensor": TORCH_CODES}.get(kind)
    return codes.get(int(code)) if codes is not None and code.isdigit() else None


def _leaf_names(data_spec: Any) -> tuple[str, ...] | None:
    """The columns of a ``data_spec``: ``value`` for one leaf, the keys of a flat dict."""
    try:
        node = json.loads(data_spec)[1]
        if node["type"] is None and not node["children_spec"]:
            return ("value",)
        keys = json.loads(node["context"]) if node["type"] == "builtins.dict" else None
        children = node["children_spec"]
        leaves = all(c["type"] is None and not c["children_spec"] for c in children)
    except (TypeError, ValueError, KeyError, IndexError):
        return None
    if not leaves or not isinstance(keys, list) or len(keys) != len(children):
        return None
    unique = len(set(keys)) == len(keys)
    return tuple(keys) if unique and all(type(k) is str for k in keys) else None
