"""Records in bulk: a unit's records as column batches, encoded with numpy per column.

A record's MDS bytes are the uint32 sizes of its variable-size columns, then every column,
sorted by name (:func:`shardstream.mds.make_parts_encoder`). Encoding record by record
costs a few microseconds of Python each: as much as reading an LMDB entry or a LitData
item, so it was most of an import's time beside the unavoidable write and hash. Here a
batch is encoded column by column instead: byte values are taken as they are, sizes come
from one ``len`` pass, ints and floats become one numpy array, fixed-size arrays are
stacked, the headers of all records are one ``(n, columns)`` uint32 array, and the
fixed-width pieces of all records (header, ints, fixed arrays) are one block cut into
rows. What is left per record is a slice and a list slot, all in C.

The bytes are exactly the per-record encoder's. Where the bulk path cannot promise that (a
value of an unexpected type, an int beyond int64, arrays of several shapes or dtypes under
a fixed-shape encoding) :func:`encode_batch` returns ``None`` and the caller encodes that
batch record by record, which also reports its bad records as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.mds import Codec
from shardstream.shard_builder.importers.source import Batch, Record

BATCH_RECORDS = 1024
"""Records per batch a format reads as columns: enough that per-batch numpy calls are
noise, few enough that a batch of ImageNet-sized records stays around 100 MB."""
GROUP_RECORDS = 256
"""Records per batch grouped from a format's records: each is a dict and tuples, and
holding fewer of them at once costs less garbage-collector time (measured on TFRecord)."""

_BYTES = {bytes, memoryview}  # a format's views of its own buffers are bytes here
_MAX_SIZE = 1 << 32  # a variable-size column's size is a uint32 in the record header
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")
Block = np.ndarray[Any, Any]  # (records, bytes per record) uint8
Sizes = np.ndarray[Any, Any]  # bytes per record (int64)
Encoded = tuple[list[Any], Sizes]  # (pieces to join, bytes per record)
Column = tuple[Block | Sequence[Any], Sizes]  # a fixed-width block or pieces, bytes per record


def batches_of(records: Iterable[Record], size: int = GROUP_RECORDS) -> Iterator[Batch]:
    """``records`` in batches of ``size`` (columnar where the records share a layout)."""
    it = iter(records)
    while chunk := list(itertools.islice(it, size)):
        yield columnize(chunk)


def columnize(records: list[Record]) -> Batch:
    """``records`` as one :class:`Batch`: columnar when every record has the same columns,
    in the same order, each with one encoding; else as rows."""
    n = len(records)
    where = _where_of(records)
    samples = list(map(itemgetter(1), records))
    layouts = set(map(tuple, samples))
    if len(layouts) != 1:
        return Batch(n, where, rows=records)
    columns: dict[str, tuple[str, Sequence[Any]]] = {}
    for name in layouts.pop():
        cells = list(map(itemgetter(name), samples))
        encodings = set(map(itemgetter(0), cells))
        if len(encodings) != 1:
            return Batch(n, where, rows=records)
        columns[name] = (encodings.pop(), list(map(itemgetter(1), cells)))
    return Batch(n, where, columns)


def _where_of(records: list[Record]) -> Any:
    return lambda i: records[i][0]


def encode_batch(codecs: Sequence[tuple[str, Codec]], batch: Batch) -> Encoded | None:
    """The MDS bytes of every record of ``batch`` as pieces to join, and each record's size.

    ``codecs`` are the schema's ``(name, codec)`` sorted by name; the
    batch's columns and encodings must be the schema's. ``None`` when a value needs the
    per-record encoder (see the module's docstring).
    """
    assert batch.columns is not None
    n = batch.count
    total = np.zeros(n, np.int64)
    header: list[np.ndarray[Any, Any]] = []  # sizes of the variable-size columns
    segments: list[Block | Sequence[Any]] = []  # per-record pieces, in record order
    run: list[Block] = []  # fixed-width blocks next to each other, joined into one
    for name, codec in codecs:
        column = _column(codec, batch.columns[name][1], n)
        if column is None:
            return None
        data, sizes = column
        total += sizes
        if codec.size is None:
            header.append(sizes)
        if isinstance(data, np.ndarray):
            run.append(data)
            continue
        if run:
            segments.append(np.hstack(run))
            run = []
        segments.append(data)
    if run:
        segments.append(np.hstack(run))
    if header:
        if max(int(s.max()) for s in header) >= _MAX_SIZE:
            return None  # the per-record encoder reports it
        head = np.stack(header, axis=1).astype("<u4").view(np.uint8)
        if isinstance(segments[0], np.ndarray):
            segments[0] = np.hstack([head, segments[0]])
        else:
            segments.insert(0, head)
        total += head.shape[1]
    if len(segments) == 1 and isinstance(segments[0], np.ndarray):
        return [segments[0].tobytes()], total  # all fixed-width: already one buffer
    # Record i is piece i of every segment, in segment order.
    pieces: list[Any] = [b""] * (len(segments) * n)
    for j, segment in enumerate(segments):
        pieces[j :: len(segments)] = _rows(segment) if isinstance(segment, np.ndarray) else segment
    return pieces, total


def _rows(block: Block) -> list[bytes]:
    """The rows of ``block`` as separate ``bytes``, sliced from one copy."""
    n, width = block.shape
    data = block.tobytes()
    bounds = map(slice, range(0, n * width, width), range(width, (n + 1) * width, width))
    return list(map(data.__getitem__, bounds))


def _column(codec: Codec, values: Sequence[Any], n: int) -> Column | None:
    """One column's bytes for every record: a fixed-width block or a list of pieces, and
    the size of each record's piece."""
    if isinstance(values, np.ndarray):  # stacked on axis 0 by the format
        shape = (n, *(codec.shape or ()))
        if codec.size and values.dtype == codec.dtype and values.shape == shape:
            return _block(np.ascontiguousarray(values), n)
        values = list(values)
    types = set(map(type, values))
    if types <= _BYTES:  # passed through as they are, whatever the encoding
        return _sized(codec, values, n)
    if types == {str} and codec.encoding == "str":
        try:
            return _sized(codec, list(map(str.encode, values)), n)
        except UnicodeEncodeError:
            return None
    if types == {int} and codec.encoding == "int":
        try:
            return _block(np.array(values, "<i8"), n)
        except OverflowError:
            return None
    if types == {float} and codec.encoding == "float64":
        return _block(np.array(values, "<f8"), n)
    if types == {np.ndarray} and _is_ndarray(codec) and len(set(map(_DTYPE, values))) == 1:
        if len(set(map(_SHAPE, values))) == 1:
            return _arrays(codec, values, n)
        if codec.size:
            return None  # the per-record encoder names the record of the wrong shape
    encode = codec.encode
    try:
        pieces = [v if type(v) in _BYTES else encode(v) for v in values]
    except InputError:
        return None
    return _sized(codec, pieces, n)


def _is_ndarray(codec: Codec) -> bool:
    return codec.encoding == "ndarray" or codec.encoding.startswith("ndarray:")


def _arrays(codec: Codec, values: Sequence[Any], n: int) -> Column | None:
    """Arrays of one dtype and shape: the codec's bytes of the first give the prefix (dtype
    code and shape, for the encodings that store them) shared by all."""
    try:
        first = codec.encode(values[0])
    except InputError:
        return None
    stacked = np.stack(values).reshape(n, -1)
    body = _block(stacked, n)[0]
    prefix = np.frombuffer(first[: len(first) - body.shape[1]], np.uint8)
    block = np.hstack([np.broadcast_to(prefix, (n, len(prefix))), body]) if len(prefix) else body
    return block, np.full(n, block.shape[1], np.int64)


def _block(array: np.ndarray[Any, Any], n: int) -> tuple[Block, Sizes]:
    block = np.ascontiguousarray(array).reshape(n, -1).view(np.uint8)
    return block, np.full(n, block.shape[1], np.int64)


def _sized(codec: Codec, pieces: Sequence[Any], n: int) -> Column | None:
    sizes = np.fromiter(map(len, pieces), np.int64, n)
    if codec.size is None:
        return pieces, sizes
    if n and not (sizes == codec.size).all():
        return None  # the per-record encoder names the record of the wrong size
    return np.frombuffer(b"".join(pieces), np.uint8).reshape(n, codec.size), sizes
