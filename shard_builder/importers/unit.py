"""One worker task of an import: read one input unit, check its records, encode them.

Records come in batches (the format's own batch reader, or its records grouped here). A
batch whose columns and encodings are the schema's is encoded in bulk
(:func:`.columnar.encode_batch`); any other batch, and a batch the bulk path declines,
goes record by record: each record's columns are checked against the schema (a record with
other columns is a bad input, named with its file and key) and encoded on its own. Both
ways give the same bytes, so which one ran changes no output byte.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.mds import get_codec, make_parts_encoder
from shardstream.shard_builder.importers.columnar import batches_of, encode_batch
from shardstream.shard_builder.importers.formats import get_format
from shardstream.shard_builder.importers.source import Batch, SourceUnit
from shardstream.shard_builder.importers.spool import SpoolWriter, map_spool
from shardstream.shard_builder.result import BadInput

Schema = tuple[tuple[str, str], ...]  # (column, MDS encoding), sorted by column
_ENCODING = operator.itemgetter(0)


@dataclass(frozen=True)
class UnitTask:
    """Read ``unit`` of ``format``, leaving out its first ``skip`` records."""

    format: str
    unit: SourceUnit
    skip: int
    columns: Schema
    spool: str = ""  # a worker process's spool folder ("": in this process, keep in memory)


@dataclass(frozen=True)
class EncodedUnit:
    """One unit's encoded samples, back to back (``sizes[i]`` bytes each): in ``chunks``
    (one per batch), or in the spool file ``spool`` when a worker process encoded them."""

    numbers: np.ndarray[Any, Any]  # record number within the unit of each sample (int64)
    sizes: np.ndarray[Any, Any]  # encoded bytes of each sample (int64)
    chunks: list[bytes]
    spool: str
    bad: list[tuple[int, BadInput]]  # (record number, what and why)

    def payload(self) -> list[memoryview]:
        """The samples' bytes, in order, as the buffers that hold them."""
        return [map_spool(self.spool)] if self.spool else [memoryview(c) for c in self.chunks]


def schema_of(sample: dict[str, tuple[str, Any]]) -> Schema:
    """The schema of one record's columns."""
    return tuple(sorted((name, enc) for name, (enc, _) in sample.items()))


def schema_text(schema: Schema) -> str:
    return ", ".join(f"{n}:{e}" for n, e in schema)


class _UnitEncoder:
    """A unit's samples as they are encoded: sizes and record numbers (in arrays, one per
    batch), the pieces of their bytes, and the bad records."""

    def __init__(self, columns: Schema, spool: str) -> None:
        self.columns = columns
        self.codecs = tuple((name, get_codec(enc)) for name, enc in columns)  # sorted by name
        self.encode = make_parts_encoder(dict(columns))
        self.layouts: set[tuple[str, ...]] = set()  # (names..., encodings...) already checked
        self.numbers: list[np.ndarray[Any, Any]] = []
        self.sizes: list[np.ndarray[Any, Any]] = []
        self.chunks: list[bytes] = []
        self.spool = SpoolWriter(spool) if spool else None
        self.bad: list[tuple[int, BadInput]] = []

    def _store(self, pieces: list[Any]) -> None:
        """Keep one batch's encoded bytes: joined into one chunk, or appended to the spool
        file. Either copies the pieces before the next batch is read, so a format may hand
        out values that are views of its own buffers, valid only until then."""
        if self.spool is not None:
            self.spool.write(pieces)
        elif pieces:
            self.chunks.append(b"".join(pieces))

    def add_batch(self, first: int, batch: Batch) -> None:
        """Add ``batch``, whose records are numbered from ``first`` in the unit."""
        if batch.columns is not None:
            schema = tuple(sorted((name, enc) for name, (enc, _) in batch.columns.items()))
            encoded = encode_batch(self.codecs, batch) if schema == self.columns else None
            if encoded is not None:
                pieces, sizes = encoded
                self.numbers.append(np.arange(first, first + batch.count, dtype=np.int64))
                self.sizes.append(sizes)
                self._store(pieces)
                return
        self.add_records(first, batch.records())

    def add_records(self, first: int, records: Any) -> None:
        """Add ``records`` one at a time (numbered from ``first``)."""
        numbers: list[int] = []
        sizes: list[int] = []
        parts: list[Any] = []
        for number, (where, sample) in enumerate(records, first):
            # A format yields its columns in the same order record after record: checking
            # that order against the known good ones takes one tuple, not a sort per record.
            layout = (*sample, *map(_ENCODING, sample.values()))
            if layout not in self.layouts:
                schema = schema_of(sample)
                if schema != self.columns:
                    reason = f"columns {schema_text(schema)}; expected {schema_text(self.columns)}"
                    self.bad.append((number, BadInput(where, reason)))
                    continue
                self.layouts.add(layout)
            try:
                pieces, size = self.encode({name: column[1] for name, column in sample.items()})
            except InputError as exc:
                self.bad.append((number, BadInput(where, str(exc))))
                continue
            numbers.append(number)
            sizes.append(size)
            parts.extend(pieces)
        self.numbers.append(np.array(numbers, np.int64))
        self.sizes.append(np.array(sizes, np.int64))
        self._store(parts)

    def finish(self) -> EncodedUnit:
        numbers = np.concatenate(self.numbers) if self.numbers else np.zeros(0, np.int64)
        sizes = np.concatenate(self.sizes) if self.sizes else np.zeros(0, np.int64)
        spool = self.spool.close() if self.spool is not None else ""
        return EncodedUnit(numbers, sizes, self.chunks, spool, self.bad)

    def abandon(self) -> None:
        """Close and remove the spool file of a unit that failed."""
        if self.spool is not None:
            os.unlink(self.spool.close())


def encode_unit(task: UnitTask) -> EncodedUnit:
    """Worker: read one unit, check every record against the schema, encode it."""
    fmt = get_format(task.format)
    out = _UnitEncoder(task.columns, task.spool)
    if fmt.read_batches is not None:
        batches = fmt.read_batches(task.unit)
    else:
        batches = batches_of(fmt.read(task.unit))
    first = 0
    try:
        for batch in batches:
            end = first + batch.count
            if end > task.skip:
                start = max(0, task.skip - first)
                out.add_batch(first + start, batch.tail(start) if start else batch)
            first = end
    except BaseException:
        out.abandon()
        raise
    return out.finish()
