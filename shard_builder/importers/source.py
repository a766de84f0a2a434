"""The source seam: what a format module gives the import build.

A format plans its input as :class:`SourceUnit` s (one file each, in a deterministic
order) and reads one unit as :data:`Record` s: ``(where, sample)`` with ``where`` naming
the file and record for error messages, and ``sample`` mapping each column to
``(MDS encoding, value)``. Readers are plain module-level functions so worker processes
can run them.

A format may also *split* a planned file into parts (key ranges of an LMDB database, item
ranges of a LitData folder, record ranges of a TFRecord file), so that several workers read
one big file at once. A split depends on the file's content and ``part_bytes`` only (never
on the number of workers), and the parts, read one after the other, give exactly the
file's records in order; so the shards stay the same bytes however the work is divided.
Positions (where a resumed import starts) count records in a file, never parts.

A format may also read a unit in *batches* (:class:`Batch`): consecutive records column
by column, so the build encodes them with a few numpy calls per column instead of Python
work per record (:mod:`.columnar`). A batch holds exactly the records ``read`` would yield,
in the same order; formats without a batch reader have their records grouped by the build.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Column = tuple[str, Any]  # (MDS encoding, value)
Record = tuple[str, dict[str, Column]]

PART_BYTES = 32 << 20
"""About how much input one worker task reads (a split's target part size): small enough
that a few parts per worker balance the load, big enough that a task's start-up (opening
the database or dataset) is noise."""


@dataclass(frozen=True)
class SourceUnit:
    """One input file of an import (its path or URL, size and modification time), or one
    part of it (``span``: where the part starts and ends, in the format's own terms)."""

    path: str
    nbytes: int
    mtime_ns: int = 0
    option: str = ""  # the format's read option (LMDB: the value format)
    span: tuple[Any, ...] = ()  # a part of the file (see the format's split); () = all of it
    first: int = 0  # the file's record number of the part's first record

    def lineage(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.nbytes, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Batch:
    """``count`` consecutive records of a unit, column by column where they share a layout.

    ``columns`` maps each column, in the order the format yields them, to ``(MDS encoding,
    values)`` with one value per record (a list, or an array stacked on axis 0); it is
    ``None`` when the records' layouts differ, and ``rows`` then holds them as records.
    ``where(i)`` names record ``i`` for an error message: built only when one is needed,
    since formatting it for every record costs as much as encoding the record. A ``bytes``
    value may be a ``memoryview`` of the format's own buffer (an LMDB page, a TFRecord
    file's bytes): it is valid until the format reads its next batch, and it is bytes in
    every other respect (:meth:`records` copies it out).
    """

    count: int
    where: Callable[[int], str]
    columns: Mapping[str, tuple[str, Sequence[Any]]] | None = None
    rows: Sequence[Record] = ()

    def records(self) -> Iterator[Record]:
        """The batch as the records ``read`` yields."""
        if self.columns is None:
            yield from self.rows
            return
        columns = self.columns
        for i in range(self.count):
            yield (
                self.where(i),
                {name: (enc, _own(values[i])) for name, (enc, values) in columns.items()},
            )

    def tail(self, start: int) -> Batch:
        """The batch without its first ``start`` records."""
        where, columns = self.where, self.columns
        return Batch(
            self.count - start,
            lambda i: where(start + i),
            None if columns is None else {n: (e, v[start:]) for n, (e, v) in columns.items()},
            self.rows[start:],
        )


def _own(value: Any) -> Any:
    """``value``, with a view of a format's buffer copied out (records outlive the batch)."""
    return bytes(value) if type(value) is memoryview else value


@dataclass(frozen=True)
class ImportFormat:
    """A format: how to plan its units and read one of them."""

    name: str
    plan: Callable[[tuple[str, ...], str], list[SourceUnit]]  # (inputs, option)
    read: Callable[[SourceUnit], Iterator[Record]]
    # Extra dataset metadata (e.g. class names), from the planned units.
    describe: Callable[[list[SourceUnit]], dict[str, Any]] | None = None
    # (unit, part_bytes) -> the unit's parts in order, each of about part_bytes of input.
    split: Callable[[SourceUnit, int], list[SourceUnit]] | None = None
    # The unit's records in batches (the same records as ``read``, in order).
    read_batches: Callable[[SourceUnit], Iterator[Batch]] | None = None
