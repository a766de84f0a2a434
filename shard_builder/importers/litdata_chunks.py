"""LitData chunk files read directly: a ``litdata.optimize`` folder's items as column
batches, with numpy over each chunk's bytes instead of LitData's Python work per item.

The byte layouts are LitData's own (``BinaryWriter._create_chunk``, the item loaders and
serializers of litdata 0.2)::

    chunk    num_items: uint32 | offsets[num_items + 1]: uint32 | items | Arrow footer?
    item     leaf sizes: uint32 each | the leaves' bytes, in ``data_format`` order

* **Items** (``PyTreeLoader``): the leaves of a flat dict (``data_spec`` names its keys)
  or one value. ``int`` and ``float`` are ``<i8`` and ``<f8``, ``bool`` one byte, ``str``
  UTF-8, ``bytes`` as they are; ``no_header_numpy:N`` and ``no_header_tensor:N`` are 1-D
  data of dtype code N, ``numpy`` has a ``dtype code, rank, shape`` header (little-endian)
  and ``tensor`` the same header big-endian, with torch's codes. The leaf sizes of a whole
  batch are one numpy gather; ints and floats another; bytes are views of the chunk.
* **Footer chunks** (flat dicts of JSON-like values): the items are an Arrow table at the
  chunk's end, which LitData reads instead of the (empty) item bodies: :mod:`.litdata_arrow`.
* **Token chunks** (``TokensLoader``): the items are token runs back to back; LitData cuts
  ``dim // block_size`` blocks of ``block_size`` tokens from the first item's start. The
  tokens left over are dropped: a block never spans two chunks.

Anything else (compressed or encrypted chunks, other serializers, nested trees) is LitData's
to read: :func:`layout_of` says ``None`` and the caller falls back to LitData. A chunk is
read by byte range, at most :data:`READ_BYTES` at a time (a local file mapped into memory,
an object's ranged reads), so a part reads only its own items. A damaged chunk (truncated,
offsets out of range, leaf sizes that do not add up, text that is not UTF-8) is one
:class:`InputError` naming the file and the item.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardstream.errors import HashMismatchError, InputError, ObjectNotFoundError
from shardstream.shard_builder.document_layout import TOKENS_COLUMN, document_layout
from shardstream.shard_builder.importers.columnar import BATCH_RECORDS
from shardstream.shard_builder.importers.litdata_arrow import FOOTER_MAGIC, footer_batches
from shardstream.shard_builder.importers.litdata_index import (
    NUMPY_CODES,
    TORCH_CODES,
    Layout,
    LitIndex,
    flat_dtype,
)
from shardstream.shard_builder.importers.source import Batch
from shardstream.shard_builder.tokenize import token_dtype

READ_BYTES = 16 << 20
"""The most bytes read at once (an item bigger than that is read whole)."""
_UTF8 = functools.partial(str, encoding="utf-8")


def read_batches(
    path: str,
    index: LitIndex,
    layout: Layout,
    span: tuple[Any, ...],
    vocab_size: int | None = None,
) -> Iterator[Batch]:
    """Items ``span = (first, end)`` of the folder (``()``: all) as batches, in order;
    ``path`` names the folder in errors. ``vocab_size``: token items read as documents
    have ids in ``[0, vocab_size)``, stored as its dtype (``None``: as they are)."""
    for c, base, lo, hi in index.pieces(layout.seq_len, span):
        chunk, n = _Chunk(path, index, c, base, lo), int(index.items[c])
        if layout.tokens is not None and not layout.seq_len:
            yield from _document_batches(chunk, n, lo, hi, layout.tokens, vocab_size=vocab_size)
        elif layout.tokens is not None:
            yield from _token_batches(chunk, n, lo, hi, layout)
        elif chunk.size >= 12 and bytes(chunk.read(chunk.size - 8, chunk.size, lo)) == FOOTER_MAGIC:
            yield from footer_batches(chunk, n, lo, hi)
        else:
            yield from _item_batches(chunk, n, lo, hi, layout)


class _Chunk:
    """One chunk file's bytes by range: a local file mapped into memory, or an object read
    with ranged reads. A missing file, and reading past its end, is a damaged chunk."""

    def __init__(self, path: str, index: LitIndex, chunk: int, base: int, first: int) -> None:
        self.path, self.name, self.base = path, index.names[chunk], base
        self.store, self.data = index.store, memoryview(b"")
        # A mapped file's bytes are views, which cost nothing to hold; an object's are read.
        self.read_ahead = READ_BYTES if self.store is not None else 1 << 62
        try:
            if self.store is not None:
                size = self.store.size(self.name)
                if size is None:
                    raise FileNotFoundError(self.name)
                self.size = size
                return
            with open(os.path.join(index.source, self.name), "rb") as fh:
                self.size = os.fstat(fh.fileno()).st_size
                if self.size:
                    mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                        mapped.madvise(mmap.MADV_SEQUENTIAL)  # read ahead, as a chunk is read
                    self.data = memoryview(mapped)
        except (FileNotFoundError, ObjectNotFoundError) as exc:
            raise self.error(first, f"LitData chunk {self.name} is missing ({exc})") from exc

    def damaged(self, item: int, why: str) -> InputError:
        """The error for the chunk's item ``item`` (a number in the chunk)."""
        return self.error(item, f"LitData chunk {self.name} is damaged ({why})")

    def error(self, item: int, what: str) -> InputError:
        return InputError(f"{self.path} item {self.base + item}: {what}")

    def read(self, start: int, end: int, item: int) -> memoryview:
        """Bytes ``start .. end - 1``, which hold (or lead to) the chunk's item ``item``."""
        if not 0 <= start <= end <= self.size:
            raise self.damaged(item, f"bytes {start}..{end} needed, the file has {self.size}")
        if self.store is None:
            return self.data[start:end]
        try:
            data = self.store.read_range(self.name, start, end, expected_size=self.size)
        except (HashMismatchError, ObjectNotFoundError) as exc:
            raise self.damaged(item, f"changed while read: {exc}") from exc
        return memoryview(data)

    def where(self, start: int) -> functools.partial[str]:
        """``where`` of a batch whose first record is the chunk's item ``start``."""
        return functools.partial(item_where, self.path, self.base + start)


def item_where(path: str, start: int, i: int) -> str:
    """How errors name item ``start + i`` of the folder ``path``."""
    return f"{path} item {start + i}"


def _count(chunk: _Chunk, n: int, lo: int, head: memoryview) -> None:
    count = struct.unpack_from("<I", head)[0]
    if count != n:
        raise chunk.damaged(lo, f"it holds {count} items, index.json says {n}")


def _offsets(chunk: _Chunk, n: int, lo: int, hi: int) -> np.ndarray[Any, Any]:
    """The offsets of items ``lo .. hi`` (where each starts, and where the last ends), each
    inside the file and after the offset table, and increasing."""
    at, stop = 4 + 4 * lo, 8 + 4 * hi
    if at <= 1 << 16:  # near the start: one read with the item count
        raw = chunk.read(0, stop, lo)
        _count(chunk, n, lo, raw)
        table = raw[at:]
    else:
        _count(chunk, n, lo, chunk.read(0, 4, lo))
        table = chunk.read(at, stop, lo)
    offsets = np.frombuffer(table, "<u4").astype(np.int64)
    begin, end = offsets[:-1], offsets[1:]
    bad = (begin < 4 * (n + 2)) | (end < begin) | (end > chunk.size)
    if bad.any():
        raise chunk.damaged(lo + int(bad.argmax()), "its offsets are out of range or decrease")
    return offsets


def _item_batches(chunk: _Chunk, n: int, lo: int, hi: int, layout: Layout) -> Iterator[Batch]:
    """Items ``lo .. hi - 1`` from their bodies: a batch per ``BATCH_RECORDS`` items or
    ``READ_BYTES`` (at least one item), each one read."""
    offsets = _offsets(chunk, n, lo, hi)
    start = lo
    while start < hi:
        at = offsets[start - lo]
        fit = int(np.searchsorted(offsets, at + READ_BYTES, "right")) - 1 + lo
        stop = min(hi, start + BATCH_RECORDS, max(start + 1, fit))
        data = chunk.read(int(at), int(offsets[stop - lo]), start)
        yield _items(chunk, data, offsets[start - lo : stop - lo + 1] - at, start, layout)
        start = stop


def _items(chunk: _Chunk, data: memoryview, offsets: Any, first: int, layout: Layout) -> Batch:
    """The items whose bodies are ``data`` (``offsets`` into it) as one column per leaf: the
    leaf-size headers gathered into one ``(items, leaves)`` array."""
    count, width = len(offsets) - 1, 4 * len(layout.leaves)
    begin, size = offsets[:-1], np.diff(offsets)
    u8 = np.frombuffer(data, np.uint8)
    bad = size < width
    if not bad.any():
        sizes = u8[begin[:, None] + np.arange(width)].view("<u4").astype(np.int64)
        ends = begin[:, None] + width + np.cumsum(sizes, axis=1)
        bad = ends[:, -1] != offsets[1:]
    if bad.any():
        raise chunk.damaged(first + int(bad.argmax()), "its leaf sizes do not add up")
    columns = {
        name: _leaf(chunk, data, fmt, ends[:, j] - sizes[:, j], sizes[:, j], first=first)
        for j, (name, fmt) in enumerate(layout.leaves)
    }
    return Batch(count, chunk.where(first), columns)


def _leaf(
    chunk: _Chunk, data: memoryview, fmt: str, starts: Any, sizes: Any, *, first: int
) -> tuple[str, Sequence[Any]]:
    """One leaf of every item (``sizes`` bytes at ``starts`` in ``data``): its encoding and
    values, those of the records of LitData's items."""
    if fmt in ("int", "float", "bool"):
        width = 1 if fmt == "bool" else 8
        wrong = sizes != width
        if wrong.any():
            raise chunk.damaged(first + int(wrong.argmax()), f"an {fmt} leaf of {width} bytes")
        raw = np.frombuffer(data, np.uint8)[starts[:, None] + np.arange(width)]
        if fmt == "bool":  # LitData's bools are records' ints (values.column_of)
            return "int", (raw[:, 0] != 0).astype(np.int64).tolist()
        if fmt == "int":
            return "int", raw.view("<i8")[:, 0].tolist()
        return "float64", raw.view("<f8")[:, 0].tolist()
    views = list(map(data.__getitem__, map(slice, starts.tolist(), (starts + sizes).tolist())))
    if fmt == "bytes":
        return "bytes", views
    if fmt == "str":
        try:
            return "str", list(map(_UTF8, views))
        except UnicodeDecodeError:
            bad = next(i for i, v in enumerate(views) if not _is_utf8(v))
            raise chunk.damaged(first + bad, "a str leaf is not UTF-8") from None
    flat = flat_dtype(fmt)
    arrays = []
    for i, view in enumerate(views):
        try:
            arrays.append(_array(view, fmt, flat))
        except ValueError as exc:
            raise chunk.damaged(first + i, f"{fmt} leaf: {exc}") from None
        except TypeError as exc:
            raise chunk.error(first + i, f"{exc} (in LitData chunk {chunk.name})") from None
    return "ndarray", arrays


def _is_utf8(view: memoryview) -> bool:
    try:
        _UTF8(view)
    except UnicodeDecodeError:
        return False
    return True


def _array(view: memoryview, fmt: str, flat: np.dtype[Any] | None) -> np.ndarray[Any, Any]:
    """One array leaf, as LitData's numpy (and torch, then ``.numpy()``) serializers give it."""
    if flat is not None:
        if len(view) % flat.itemsize:
            raise ValueError(f"{len(view)} bytes of {flat.name}")
        return np.frombuffer(view, flat)
    order, codes = ("<", NUMPY_CODES) if fmt == "numpy" else (">", TORCH_CODES)
    if len(view) < 8:
        raise ValueError(f"{len(view)} bytes")
    code, rank = struct.unpack_from(order + "II", view)
    body = 8 + 4 * rank
    if len(view) < body:
        raise ValueError(f"{len(view)} bytes for a shape of {rank} dimensions")
    dtype = codes.get(code)
    if dtype is None:  # e.g. a bfloat16 tensor, which LitData gives and numpy cannot hold
        raise TypeError(f"a {fmt} leaf of dtype code {code} has no numpy dtype to import as")
    shape = struct.unpack_from(f"{order}{rank}I", view, 8)
    if len(view) - body != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{len(view) - body} bytes for {dtype.name} of shape {shape}")
    return np.frombuffer(view[body:], dtype).reshape(shape)


def _document_batches(
    chunk: _Chunk, n: int, lo: int, hi: int, dtype: np.dtype[Any], *, vocab_size: int | None
) -> Iterator[Batch]:
    """Token items ``lo .. hi - 1`` whole, one document each in the documents layout
    (:mod:`~shardstream.shard_builder.document_layout`: ``dtype`` ids, or with
    ``vocab_size`` ids checked to be in ``[0, vocab_size)`` and stored as its dtype); the
    offsets table says where each begins. A batch per ``BATCH_RECORDS`` items or
    ``READ_BYTES``."""
    stored = token_dtype(vocab_size) if vocab_size else dtype
    if vocab_size and dtype.kind not in "iu":
        raise chunk.error(lo, f"the token ids are {dtype.name}, not integers")
    encoding = document_layout(TOKENS_COLUMN, stored, masked=False)[TOKENS_COLUMN]
    offsets = _offsets(chunk, n, lo, hi)
    sizes = np.diff(offsets)
    odd = sizes % dtype.itemsize != 0
    if odd.any():
        i = int(odd.argmax())
        raise chunk.damaged(lo + i, f"{sizes[i]} bytes is no whole number of {dtype.name}")
    start = lo
    while start < hi:
        at = int(offsets[start - lo])
        stop = start + 1
        while (
            stop < hi and stop - start < BATCH_RECORDS and offsets[stop + 1 - lo] - at <= READ_BYTES
        ):
            stop += 1
        data = chunk.read(at, int(offsets[stop - lo]), start)
        cuts = (offsets[start - lo : stop - lo + 1] - at) // dtype.itemsize
        flat: Any = np.frombuffer(data, dtype)
        if vocab_size:
            flat = _in_vocab(chunk, start, flat, cuts, vocab_size).astype(stored, copy=False)
        docs = [flat[a:b] for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True)]
        yield Batch(stop - start, chunk.where(start), {TOKENS_COLUMN: (encoding, docs)})
        start = stop


def _in_vocab(chunk: _Chunk, start: int, flat: Any, cuts: Any, vocab_size: int) -> Any:
    """``flat`` (the tokens of items ``start ..``, item ``k``'s at ``cuts[k]:cuts[k + 1]``),
    whose ids must all be in ``[0, vocab_size)``: else one error naming the first id outside,
    its item and its place in the item."""
    if not flat.size or (int(flat.min()) >= 0 and int(flat.max()) < vocab_size):
        return flat
    at = int(((flat < 0) | (flat >= vocab_size)).argmax())
    k = int(np.searchsorted(cuts, at, side="right")) - 1
    raise chunk.error(
        start + k,
        f"token {at - int(cuts[k])} is {int(flat[at])}, outside the vocabulary "
        f"[0, {vocab_size}) (--vocab-size)",
    )


def _token_batches(chunk: _Chunk, n: int, lo: int, hi: int, layout: Layout) -> Iterator[Batch]:
    """Token blocks ``lo .. hi - 1``: block ``k`` is tokens ``k * seq_len ..`` of the chunk."""
    assert layout.tokens is not None
    dtype, seq_len = layout.tokens, layout.seq_len
    _count(chunk, n, lo, chunk.read(0, 4, lo))
    head, width = 4 * (n + 2), seq_len * dtype.itemsize
    whole = (chunk.size - head) // width  # the blocks the file holds
    if whole < hi:
        raise chunk.damaged(max(lo, whole), f"it ends inside (or before) block {max(lo, whole)}")
    step = max(1, min(BATCH_RECORDS, READ_BYTES // width))
    for start in range(lo, hi, step):
        stop = min(hi, start + step)
        data = chunk.read(head + start * width, head + stop * width, start)
        blocks: Any = np.frombuffer(data, dtype).reshape(stop - start, seq_len)  # rows: samples
        tokens = (f"ndarray:{dtype.name}:{seq_len}", blocks)
        yield Batch(stop - start, chunk.where(start), {"tokens": tokens})
