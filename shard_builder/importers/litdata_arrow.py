"""LitData chunks whose items are an Arrow table: read column by column, as LitData reads them.

LitData (0.2) writes a chunk of flat dicts of JSON-like values (str, int, float, bool,
bytes, lists, dicts) as the chunk's header, empty item bodies and a *footer*::

    Arrow IPC file of the rows | its length: uint32 | b"LDARW01\\0"

in record batches of 256 rows, and reads item ``k`` back as row ``k % 256`` of record batch
``k // 256`` (``to_pylist``). Here each record batch becomes one :class:`Batch`: a column
per field, with ``to_pylist`` values (the very objects LitData's rows hold), binary fields
as views of the Arrow buffer instead. A batch with a value no plain column holds (a null
where a row lacked the key, a list) becomes rows, each ``values.columns_of`` of LitData's
row, as before. The IPC file is read through a window of ranged reads, so a part of a big
chunk reads about its own record batches, not the whole footer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.arrow_buffers import binary_views, numbers
from shardstream.shard_builder.importers.source import Batch
from shardstream.shard_builder.importers.values import PLAIN_TYPES, columns_of

FOOTER_MAGIC = b"LDARW01\0"
_ROWS = 256  # rows per record batch (LitData's item_loader._DEFAULT_BATCH_ROWS)


class ChunkBytes(Protocol):
    """A chunk file's bytes by range (``litdata_chunks``)."""

    size: int
    read_ahead: int  # how many bytes one read may fetch beyond what it needs

    def read(self, start: int, end: int, item: int) -> memoryview: ...
    def damaged(self, item: int, why: str) -> InputError: ...
    def where(self, start: int) -> Callable[[int], str]: ...


def plain_encoding(values: Sequence[Any]) -> str | None:
    """The column encoding of ``values`` when all have one plain type."""
    types = set(map(type, values))
    if len(types) != 1:
        return None
    kind = types.pop()
    return "ndarray" if kind is np.ndarray else PLAIN_TYPES.get(kind)


def footer_batches(chunk: ChunkBytes, n: int, lo: int, hi: int) -> Iterator[Batch]:
    """Items ``lo .. hi - 1`` of a chunk of ``n`` items that ends with an Arrow footer."""
    import pyarrow as pa

    length = int.from_bytes(chunk.read(chunk.size - 12, chunk.size - 8, lo), "little")
    start = chunk.size - 12 - length
    if length <= 0 or start < 4 * (n + 2):
        raise chunk.damaged(lo, f"its Arrow footer of {length} bytes does not fit in it")
    # Where the part's record batches should end (rows take about equal bytes), so that a
    # part of a big chunk reads little more than its own rows.
    until = start + length * min(n, -(-hi // _ROWS) * _ROWS) // max(n, 1) + (1 << 20)
    file = pa.PythonFile(_Window(chunk, start, start + length, until, lo), mode="r")
    with _arrow_errors(chunk, lo):
        if bytes(chunk.read(start, min(start + 6, chunk.size), lo)) == b"ARROW1":  # as LitData
            batches = _file(chunk, pa.ipc.open_file(file), n, lo, hi)
        else:  # an older writer's IPC stream
            batches = _stream(chunk, pa.ipc.open_stream(file))
    for first, batch in batches:
        stop = first + batch.num_rows
        if stop > lo:
            a, b = max(lo, first), min(hi, stop)
            with _arrow_errors(chunk, a):
                items = _batch(chunk, batch.slice(a - first, b - a), a)
            yield items
        if stop >= hi:
            return
    raise chunk.damaged(lo, f"its Arrow footer ends before item {hi}")


@contextlib.contextmanager
def _arrow_errors(chunk: ChunkBytes, item: int) -> Iterator[None]:
    """pyarrow's errors on a damaged footer (``ArrowInvalid``, ``OSError``, undecodable
    names...) as the chunk's one :class:`InputError` for ``item``."""
    try:
        yield
    except InputError:
        raise
    except Exception as exc:
        raise chunk.damaged(item, f"its Arrow footer: {exc}") from exc


def _file(chunk: ChunkBytes, reader: Any, n: int, lo: int, hi: int) -> Iterator[tuple[int, Any]]:
    """``(first row, record batch)`` of an IPC file: batch ``i`` holds rows ``256 i ..``."""
    for i in range(lo // _ROWS, min(reader.num_record_batches, -(-hi // _ROWS))):
        with _arrow_errors(chunk, max(lo, i * _ROWS)):
            batch = reader.get_batch(i)
            batch.validate(full=True)
        if batch.num_rows != min(_ROWS, n - i * _ROWS):
            raise chunk.damaged(i * _ROWS, f"{batch.num_rows} rows in Arrow record batch {i}")
        yield i * _ROWS, batch


def _stream(chunk: ChunkBytes, reader: Any) -> Iterator[tuple[int, Any]]:
    """``(first row, record batch)`` of an IPC stream, one after the other."""
    first = 0
    while True:
        with _arrow_errors(chunk, first):
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            batch.validate(full=True)
        yield first, batch
        first += batch.num_rows


def _batch(chunk: ChunkBytes, rows: Any, first: int) -> Batch:
    """Rows of a record batch (the chunk's items ``first ..``) as one :class:`Batch`."""
    where, names = chunk.where(first), rows.schema.names
    columns: dict[str, tuple[str, Sequence[Any]]] = {}
    for name, array in zip(names, rows.columns, strict=True):
        encoding, values = _column(array)
        if encoding is None:
            break
        columns[name] = (encoding, values)
    if len(columns) == len(names):
        return Batch(rows.num_rows, where, columns)
    items = rows.to_pylist()  # LitData's rows, converted as the records of its items were
    records = [(where(i), columns_of(item, where(i))) for i, item in enumerate(items)]
    return Batch(len(items), where, rows=records)


def _column(array: Any) -> tuple[str | None, Sequence[Any]]:
    import pyarrow as pa

    kind = array.type
    if array.null_count == 0 and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return "bytes", binary_views(array)
    if array.null_count == 0 and pa.types.is_boolean(kind):  # LitData's bools: int columns
        return "int", numbers(array).astype(np.int64).tolist()
    values = array.to_pylist()
    return plain_encoding(values), values


class _Window:
    """A file-like view of a chunk's bytes ``start .. end`` for pyarrow's IPC readers. A read
    outside the bytes held fetches the next window: up to the chunk's ``read_ahead`` bytes,
    but not past ``until`` (where the part's rows should end) unless the read needs it; so
    reading record batches one after the other costs a ranged read per window, not per batch.
    """

    closed = False

    def __init__(self, chunk: ChunkBytes, start: int, end: int, until: int, item: int) -> None:
        self.chunk, self.start, self.end, self.until, self.item = chunk, start, end, until, item
        self.pos = self.at = 0
        self.held = memoryview(b"")

    def read(self, size: int = -1) -> memoryview:
        left = self.end - self.start - self.pos
        size = left if size is None or size < 0 else min(size, left)
        offset = self.pos - self.at
        if offset < 0 or offset + size > len(self.held):
            a = self.start + self.pos
            b = min(self.end, max(a + size, min(a + self.chunk.read_ahead, self.until)))
            self.held, self.at, offset = self.chunk.read(a, b, self.item), self.pos, 0
        self.pos += size
        return self.held[offset : offset + size]

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0, self.pos, self.end - self.start)[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
