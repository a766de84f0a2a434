"""The bad lines a text build left out (``--skip-bad``): counted, the first few named.

Workers count a chunk's bad records and keep the first few by byte offset (JSONL) or row
(Parquet) (:class:`~.text_source.BadRecords`); this process, taking chunks in order, turns
those into ``file:line`` names and keeps the build's first :data:`NAMED_BAD_RECORDS`. The
state goes into every journal record, so a resumed build reports what an uninterrupted one
would.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from shardstream.shard_builder.result import BadInput
from shardstream.shard_builder.text_source import NAMED_BAD_RECORDS, BadRecords, TextChunk


class SkippedLines:
    """Bad records left out so far: :attr:`count` of them, :attr:`named` the first few."""

    def __init__(self) -> None:
        self.count = 0
        self.named: list[BadInput] = []
        # Where line counting stands in a file: names come in file order, so each file is
        # read once at most however many lines are named.
        self._cursor: tuple[Path, int, int] | None = None  # (path, offset, line there)

    def take(self, chunk: TextChunk, bad: BadRecords | None) -> None:
        """Count a chunk's bad records (chunks taken in input order) and name the first."""
        if bad is None or not bad.count:
            return
        self.count += bad.count
        for where, problem in bad.first[: NAMED_BAD_RECORDS - len(self.named)]:
            if chunk.kind == "parquet":
                source = f"{chunk.path}: row {where}"
            else:
                source = f"{chunk.path}:{self._line(chunk.path, where)}"
            self.named.append(BadInput(source, problem))

    def _line(self, path: Path, offset: int) -> int:
        start, line = 0, 1
        if self._cursor is not None and self._cursor[0] == path and self._cursor[1] <= offset:
            _, start, line = self._cursor
        with open(path, "rb") as fh:
            fh.seek(start)
            line += fh.read(offset - start).count(b"\n")
        self._cursor = (path, offset, line)
        return line

    def state(self) -> dict[str, Any]:
        """For a journal record (and ``shardstream.json``): the count and the named."""
        return {"count": self.count, "named": [asdict(b) for b in self.named]}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a journal record's :meth:`state` (``None``: from nothing)."""
        state = state or {}
        self.count = int(state.get("count", 0))
        self.named = [BadInput(**b) for b in state.get("named", [])]
        self._cursor = None
