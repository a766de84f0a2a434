"""The source seam: what a format module gives the import build.

A format plans its input as :class:`SourceUnit` s (one file each, in a deterministic
order) and reads one unit as :data:`Record` s: ``(where, sample)`` with ``where`` naming
the file and record for error messages, and ``sample`` mapping each column to
``(MDS encoding, value)``. Readers are plain module-level functions so worker processes
can run them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Column = tuple[str, Any]  # (MDS encoding, value)
Record = tuple[str, dict[str, Column]]


@dataclass(frozen=True)
class SourceUnit:
    """One input file of an import: its path or URL, size and modification time."""

    path: str
    nbytes: int
    mtime_ns: int = 0
    option: str = ""  # the format's read option (LMDB: the value format)

    def lineage(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.nbytes, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class ImportFormat:
    """A format: how to plan its units and read one of them."""

    name: str
    plan: Callable[[tuple[str, ...], str], list[SourceUnit]]  # (inputs, option)
    read: Callable[[SourceUnit], Iterator[Record]]
    # Extra dataset metadata (e.g. class names), from the planned units.
    describe: Callable[[list[SourceUnit]], dict[str, Any]] | None = None
