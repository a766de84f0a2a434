"""Reading documents from JSONL and Parquet in independent chunks.

A build splits its inputs into chunks that worker processes read and tokenize in
parallel: byte ranges of a JSONL file cut at line ends, and row groups of a Parquet file
(read in record batches, so a file is never in memory whole). Chunks depend only on the
files and ``chunk_bytes``, never on the worker count, and the token stream is the chunks'
tokens in order, so the output cannot depend on scheduling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any, Literal

from shardstream.errors import InputError
from shardstream.shard_builder.inputs import InputFile, file_kind

_PARQUET_BATCH_ROWS = 8192


@dataclass(frozen=True)
class TextChunk:
    """One unit of work: ``[start, end)`` bytes of a JSONL file, or one Parquet row group."""

    path: Path
    kind: Literal["jsonl", "parquet"]
    start: int  # byte offset (jsonl) or row group index (parquet)
    end: int  # byte offset (jsonl) or unused (parquet)
    first_row: int = 0  # rows before this row group (parquet), for error messages
    nbytes: int = 0  # share of the input file's bytes (for progress)


def plan_chunks(
    files: Sequence[InputFile], field: str | tuple[str, ...], chunk_bytes: int = 2 << 20
) -> list[TextChunk]:
    """Split every file into chunks of about ``chunk_bytes`` (JSONL) or one per row group
    (each Parquet file checked to have the text ``field``, or every one of ``field``)."""
    fields = (field,) if isinstance(field, str) else field
    chunks: list[TextChunk] = []
    for f in files:
        if file_kind(f.path) == "parquet":
            for name in fields[1:]:
                list(_parquet_chunks(f.path, f.size, name))  # checks the column
            chunks.extend(_parquet_chunks(f.path, f.size, fields[0]))
        else:
            chunks.extend(_jsonl_chunks(f.path, f.size, chunk_bytes))
    return chunks


def _jsonl_chunks(path: Path, size: int, chunk_bytes: int) -> Iterator[TextChunk]:
    start = 0
    with open(path, "rb") as fh:
        while start < size:
            target = start + chunk_bytes
            if target >= size:
                yield TextChunk(path, "jsonl", start, size, nbytes=size - start)
                return
            fh.seek(target)
            fh.readline()  # move to the end of the line that straddles the target
            end = min(fh.tell(), size)
            yield TextChunk(path, "jsonl", start, end, nbytes=end - start)
            start = end


def _open_parquet(path: Path) -> object:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc


def _parquet_chunks(path: Path, size: int, field: str) -> Iterator[TextChunk]:
    import pyarrow as pa

    pf = _open_parquet(path)
    schema = pf.schema_arrow  # type: ignore[attr-defined]
    if field not in schema.names:
        raise InputError(
            f"{path}: no column {field!r} (columns: {', '.join(schema.names)}); "
            "name the text column with --field"
        )
    col_type = schema.field(field).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise InputError(f"{path}: column {field!r} has type {col_type}, expected string")
    meta = pf.metadata  # type: ignore[attr-defined]
    first_row = 0
    groups = meta.num_row_groups
    for rg in range(groups):
        share = size // groups + (size % groups if rg == groups - 1 else 0)
        yield TextChunk(path, "parquet", rg, rg + 1, first_row, share)
        first_row += meta.row_group(rg).num_rows


NAMED_BAD_RECORDS = 10
"""Bad records a build names (file and line or row, and why); it counts all of them."""


@dataclass
class BadRecords:
    """A chunk's records left out (``skip_bad``): how many, and the first
    :data:`NAMED_BAD_RECORDS` by where they start (a JSONL line's byte offset, or a Parquet
    row) with what is wrong. Offsets, not line numbers: a chunk starts mid-file, and only
    the lines a build names are worth counting the lines before."""

    count: int = 0
    first: list[tuple[int, str]] = dataclass_field(default_factory=list)

    def add(self, where: int, problem: str) -> None:
        """Count one bad record, and keep it by name while fewer than the limit are."""
        self.count += 1
        if len(self.first) < NAMED_BAD_RECORDS:
            self.first.append((where, problem))


def read_docs(chunk: TextChunk, field: str, bad: BadRecords | None = None) -> Iterator[list[str]]:
    """The chunk's documents in order, in batches; :class:`InputError` names file and
    line/row of the first bad record, or with ``bad`` given, bad records go there."""
    for records in read_records(chunk, (field,), bad):
        yield [r[0] for r in records]


def read_records(
    chunk: TextChunk, fields: tuple[str, ...], bad: BadRecords | None = None
) -> Iterator[list[tuple[str, ...]]]:
    """The chunk's records in order, in batches, each as its string ``fields`` (e.g.
    ``("prompt", "response")``); :class:`InputError` names file and line/row of the first
    bad record, or with ``bad`` given, bad records are left out and counted there."""
    if chunk.kind == "parquet":
        yield from _parquet_docs(chunk, fields, bad)
    else:
        yield _jsonl_docs(chunk, fields, bad)


class _BadLineError(Exception):
    """What is wrong with one JSONL line (its place is the caller's)."""


def _jsonl_docs(
    chunk: TextChunk, fields: tuple[str, ...], bad: BadRecords | None
) -> list[tuple[str, ...]]:
    with open(chunk.path, "rb") as fh:
        fh.seek(chunk.start)
        data = fh.read(chunk.end - chunk.start)
    docs: list[tuple[str, ...]] = []
    offset = chunk.start
    for line in data.split(b"\n"):
        line_start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue  # blank lines (and the one after a trailing newline) carry no document
        try:
            docs.append(_fields_of(_parse_line(line), fields))
        except _BadLineError as exc:
            if bad is None:
                raise _line_error(chunk.path, line_start, str(exc)) from None
            bad.add(line_start, str(exc))
    return docs


def _fields_of(obj: Any, fields: tuple[str, ...]) -> tuple[str, ...]:
    texts = []
    for field in fields:
        if not isinstance(obj, dict) or field not in obj:
            keys = ", ".join(obj) if isinstance(obj, dict) else type(obj).__name__
            hint = "use --field" if len(fields) == 1 else "use --prompt-field/--response-field"
            raise _BadLineError(f"no field {field!r} (found: {keys}); {hint}")
        text = obj[field]
        if not isinstance(text, str):
            raise _BadLineError(f"field {field!r} is {type(text).__name__}, not a string")
        texts.append(text)
    return tuple(texts)


# A \uD800-\uDFFF escape: only in JSON text can a string hold a lone surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _parse_line(line: bytes) -> Any:
    """The JSON value of one line; bad JSON, JSON nested deeper than the parser follows
    (a RecursionError) and a lone surrogate escape (valid JSON, but no Unicode text: the
    tokenizer failed on it) are one :class:`_BadLineError` saying which."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise _BadLineError(
            f"invalid JSON ({exc}); text input is JSON Lines: one object per line"
        ) from None
    except RecursionError:
        raise _BadLineError("JSON nested too deeply to read") from None
    if _SURROGATE_ESCAPE.search(line) is not None:  # rare: checked only where one may be
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            char = f"\\u{ord(exc.object[exc.start]):04x}"
            raise _BadLineError(f"a lone surrogate {char} in a string: not Unicode text") from None
    return obj


def line_number(path: Path, offset: int) -> int:
    """The number (from 1) of the line starting at byte ``offset`` of ``path``."""
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def _line_error(path: Path, offset: int, problem: str) -> InputError:
    # Line numbers are counted only when something is wrong: chunks start mid-file.
    return InputError(f"{path}:{line_number(path, offset)}: {problem}")


def _parquet_docs(
    chunk: TextChunk, fields: tuple[str, ...], bad: BadRecords | None
) -> Iterator[list[tuple[str, ...]]]:
    pf = _open_parquet(chunk.path)
    row = chunk.first_row
    try:
        batches = pf.iter_batches(  # type: ignore[attr-defined]
            batch_size=_PARQUET_BATCH_ROWS, row_groups=[chunk.start], columns=list(fields)
        )
        for batch in batches:
            values = [batch.column(at).to_pylist() for at in range(len(fields))]
            docs: list[tuple[str, ...]] = []
            for at, record in enumerate(zip(*values, strict=True)):
                if None in record:
                    problem = f"field {fields[record.index(None)]!r} is null"
                    if bad is None:
                        raise InputError(f"{chunk.path}: row {row + at}: {problem}")
                    bad.add(row + at, problem)
                    continue
                docs.append(record)
            row += batch.num_rows
            yield docs
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"{chunk.path}: row group {chunk.start} (rows from {row}) cannot be read ({exc})"
        ) from exc
