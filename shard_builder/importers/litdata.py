"""LitData optimized datasets (``litdata.optimize`` output): general items and token chunks.

A source is an optimized folder or an ``s3://`` (any URL) prefix; planning and splitting
read only its ``index.json`` (:mod:`.litdata_index`). The items are read from the chunk
files directly (:mod:`.litdata_chunks`, :mod:`.litdata_arrow`) wherever LitData's layout is
simple and stable: flat dicts of ``str`` keys, or single values, whose leaves are ``bytes``,
``str``, ``int``, ``float``, ``bool``, numpy arrays or tensors, and token chunks, all
uncompressed and unencrypted. That costs numpy calls per batch instead of LitData's few
microseconds of Python per item, and a part of a remote folder reads only its own byte
ranges, in memory. Any other layout (compressed or encrypted chunks, images and other
serializers, nested trees) is read with LitData's own ``StreamingDataset`` in order
(``shuffle=False``), as before; a part of a remote folder then downloads just its chunks,
into a temp folder it removes when done. The direct reader is a second implementation of
LitData's format, so the tests hold it to LitData's: every layout it takes is compared
with ``StreamingDataset`` field by field, and its shards byte for byte with the import
through LitData.

* **General items** (``PyTreeLoader``): a dict becomes one column per key; a single value
  one column ``value``. ``int`` -> ``int``, ``float`` -> ``float64``, ``str`` -> ``str``,
  ``bytes`` -> ``bytes``, numpy arrays and torch tensors -> ``ndarray``, lists, dicts and
  ``None`` -> ``json``; any other type (e.g. a decoded image) is one error naming the item.
* **Token chunks** (``TokensLoader``): LitData cuts the token stream into blocks of the
  ``block_size`` the reader asks for, which the folder does not record; ``--seq-len N``
  gives it. Each block becomes a ``tokens`` sample of ``ndarray:<dtype>:N``, the layout
  ``shardstream build text`` writes, so the token path reads it without re-tokenizing.
  With ``--documents`` instead, each item (one ``optimize`` call's token array: a document)
  becomes one ``tokens`` sample of ``ndarray:<dtype>`` as it is, in the documents layout
  (:mod:`~shardstream.shard_builder.document_layout`, as ``build text --documents`` and
  ``import hf --documents`` write it), for readers that pack at read time
  (``PackOptions``); with ``--vocab-size N`` as well, every id must be in ``[0, N)`` (else
  one error naming the item and the token) and is stored as uint16 when N <= 65,536, else
  uint32.

A folder is split into item ranges of about ``part_bytes`` (small chunks grouped, big ones
cut), read by several workers at once; each reads its items by index, as LitData does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.errors import InputError, ObjectNotFoundError
from shardstream.shard_builder.importers import litdata_chunks
from shardstream.shard_builder.importers.columnar import BATCH_RECORDS
from shardstream.shard_builder.importers.litdata_arrow import plain_encoding
from shardstream.shard_builder.importers.litdata_index import (
    LitIndex,
    index_of,
    layout_of,
    read_index,
)
from shardstream.shard_builder.importers.source import Batch, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.importers.values import column_of, columns_of

DOCUMENTS = "documents"
"""The unit option of a token folder imported one document per item (``--documents``),
followed by ``|<vocab size>`` where ids are checked against one (``--vocab-size``)."""


def documents_option(vocab_size: int | None) -> str:
    """The unit option of a ``--documents`` import (with ``vocab_size``, if any)."""
    return f"{DOCUMENTS}|{vocab_size}" if vocab_size else DOCUMENTS


def _documents(option: str) -> tuple[bool, int | None]:
    """Whether ``option`` imports documents, and the vocab size their ids are checked
    against (``None``: none)."""
    mark, _, vocab = option.partition("|")
    return mark == DOCUMENTS, int(vocab) if vocab else None


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    units = []
    documents = _documents(option)[0]
    for arg in inputs:
        index = read_index(arg)
        loader = index.config.get("item_loader")
        if loader == "TokensLoader" and not option:
            raise InputError(
                f"{arg}: a LitData token dataset (TokensLoader) does not record its block "
                "size; give --seq-len N, the block_size your training reads it with, or "
                "--documents to keep each item as one document"
            )
        if documents and loader != "TokensLoader":
            raise InputError(
                f"{arg}: --documents imports LitData token datasets (TokensLoader); this one "
                f"has items of {loader or 'PyTreeLoader'}"
            )
        if documents and layout_of(index, 0) is None:
            raise InputError(
                f"{arg}: --documents reads uncompressed, unencrypted token chunks only; "
                "this folder's chunks are not (give --seq-len N to import it through LitData)"
            )
        if loader not in ("TokensLoader", "PyTreeLoader", None):
            raise InputError(f"{arg}: LitData item loader {loader!r} is not supported")
        if loader == "TokensLoader" and (index.dims < 0).any():
            raise InputError(f"{arg}: a LitData token dataset whose chunks lack their dim")
        units.append(SourceUnit(arg, int(index.sizes.sum()), index.mtime_ns))
    return units


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as item ranges ``span = (first item, end item)`` of about ``part_bytes``."""
    index = index_of(unit)
    parts: list[SourceUnit] = []
    first = end = held = 0  # the part being filled: items [first, end), about held bytes

    def emit() -> None:
        nonlocal first, held
        if end > first:
            parts.append(replace(unit, nbytes=held, span=(first, end), first=first))
        first, held = end, 0

    # LitData's own item count per chunk (its loaders' generate_intervals).
    counts = index.counts(_seq_len(unit, index)).tolist()
    for items, nbytes in zip(counts, index.sizes.tolist(), strict=True):
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


def _seq_len(unit: SourceUnit, index: LitIndex) -> int:
    """The token block size (0: general items, or a token folder's items as documents)."""
    tokens = index.config.get("item_loader") == "TokensLoader" and not _documents(unit.option)[0]
    return int(unit.option) if tokens else 0


def read(unit: SourceUnit) -> Iterator[Record]:
    index = index_of(unit)
    layout = layout_of(index, _seq_len(unit, index))
    if layout is not None:
        vocab = _documents(unit.option)[1]
        for batch in litdata_chunks.read_batches(unit.path, index, layout, unit.span, vocab):
            yield from batch.records()
        return
    with _folder(unit, index) as folder:
        for start, items, seq_len in _items(unit, folder):
            for i, item in enumerate(items, start):
                yield _record(f"{unit.path} item {i}", item, seq_len)


def read_batches(unit: SourceUnit) -> Iterator[Batch]:
    """The records of :func:`read`, a batch per chunk piece (direct reads) or per
    ``BATCH_RECORDS`` items (LitData's): columnar when the items are dicts with the same
    keys whose values have one plain type per key (or token blocks of one dtype), else as
    rows."""
    index = index_of(unit)
    layout = layout_of(index, _seq_len(unit, index))
    if layout is not None:
        vocab = _documents(unit.option)[1]
        yield from litdata_chunks.read_batches(unit.path, index, layout, unit.span, vocab)
        return
    with _folder(unit, index) as folder:
        for start, items, seq_len in _items(unit, folder):
            where = functools.partial(litdata_chunks.item_where, unit.path, start)
            columns = _token_columns(items, seq_len) if seq_len else _item_columns(items)
            if columns is not None:
                yield Batch(len(items), where, columns)
            else:
                rows = [_record(where(i), item, seq_len) for i, item in enumerate(items)]
                yield Batch(len(items), where, rows=rows)


@contextlib.contextmanager
def _folder(unit: SourceUnit, index: LitIndex) -> Iterator[str]:
    """A local folder LitData reads the unit's items from: the source folder itself, or for a
    remote one a temp folder with ``index.json`` and the chunks of the unit's items only,
    removed when the unit is read (or given up)."""
    if index.store is None:
        yield index.source
        return
    dest = Path(tempfile.mkdtemp(prefix="shardstream-litdata-"))
    try:
        index.store.download("index.json", dest / "index.json")
        for chunk, base, lo, _ in index.pieces(_seq_len(unit, index), unit.span):
            name = index.names[chunk]
            try:
                index.store.download(name, dest / name)
            except ObjectNotFoundError as exc:
                where = f"{unit.path} item {base + lo}"
                raise InputError(f"{where}: LitData chunk {name} is missing ({exc})") from exc
        yield str(dest)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def _open(unit: SourceUnit, folder: str) -> tuple[Any, int]:
    """LitData's ``StreamingDataset`` over ``folder`` (items in order), and the token block
    size (0: general items)."""
    from litdata import StreamingDataset, TokensLoader

    logging.getLogger("litdata").setLevel(logging.WARNING)  # not one INFO line per open

    seq_len = _seq_len(unit, index_of(unit))
    try:
        if seq_len:
            ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=seq_len))
        else:
            ds = StreamingDataset(folder, shuffle=False)
        len(ds)  # LitData reads index.json's config here, the first time: its errors too
        return ds, seq_len
    except Exception as exc:  # LitData raises its own and plain errors alike
        where = f"{unit.path.rstrip('/')}/index.json"
        raise InputError(f"{where}: LitData cannot open the dataset ({exc})") from exc


def _items(unit: SourceUnit, folder: str) -> Iterator[tuple[int, list[Any], int]]:
    """``(first item number, items, seq_len)``: the unit's items in lists of
    ``BATCH_RECORDS``, read with LitData in order."""
    ds, seq_len = _open(unit, folder)
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


def _item_columns(items: list[Any]) -> dict[str, tuple[str, Sequence[Any]]] | None:
    """``items`` as columns, or ``None`` when a value needs :func:`column_of`'s conversion
    (or its error, which :func:`read` raises for the first such item in order)."""
    if set(map(type, items)) != {dict}:
        encoding = plain_encoding(items)
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
        encoding = plain_encoding(values)
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
