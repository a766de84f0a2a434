"""Hugging Face ``datasets`` folders (``save_to_disk``) and Arrow/Parquet files.

A ``Dataset.save_to_disk`` folder lists its Arrow files in ``state.json``; a
``DatasetDict`` folder holds one such folder per split (chosen with ``--split``). Features
(kept by ``datasets`` in the Arrow schema metadata) map to MDS columns: ``Image`` -> the
encoded image bytes (``jpeg``/``png`` when every value is one, else ``bytes``),
``ClassLabel`` -> int (names kept in the dataset metadata as ``label_names``), a list of
ints/floats -> ndarray, string -> str, int -> int, float -> float64, bool -> int,
anything else -> json. Loading by Hub name is not supported: save the dataset to disk
first (``datasets.load_dataset(...).save_to_disk(path)``). With ``--documents`` each row's
``input_ids`` becomes one document instead, in the documents layout (:mod:`.hf_documents`).

Record batches are read as columns where every value of a column maps to one plain
encoding (strings, binaries, ints, bools, floats, without nulls): binaries and strings as
views of the Arrow buffers (no Python object per value), numbers as one numpy array. Any
other batch (images, lists, structs, nulls) goes row by row, as :func:`read` gives it. A
big file is split into ranges of record batches (Arrow) or row groups (Parquet) that
several workers read at once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.arrow_buffers import binary_views, numbers
from shardstream.shard_builder.importers.hf_documents import HfOption, document_batch, notes
from shardstream.shard_builder.importers.source import (
    Batch,
    Column,
    ImportFormat,
    Record,
    SourceUnit,
)
from shardstream.shard_builder.inputs import inside, resolve_inputs

_SUFFIXES = (".arrow", ".parquet", ".pq")
BATCH_ROWS = 1024  # rows per record batch, at most
BATCH_BYTES = 4 << 20
"""About the most bytes of values a record batch of a Parquet file holds (by its metadata):
small values still come 1,024 rows at a time, big ones a few rows at a time."""
PARQUET_BUFFER = 1 << 20  # bytes read at a time from a column chunk
DEFAULT_SPLIT = "train"  # of a DatasetDict, when --split is not given (said in the summary)


def _folder_files(path: str, split: str) -> list[str]:
    if os.path.exists(os.path.join(path, "dataset_dict.json")):
        splits = _json_field(os.path.join(path, "dataset_dict.json"), "splits")
        if not all(isinstance(s, str) for s in splits):
            raise InputError(f"{path}/dataset_dict.json: 'splits' is not a list of names")
        if (split or DEFAULT_SPLIT) not in splits:
            raise InputError(
                f"{path}: a DatasetDict with splits {', '.join(splits)}; choose one with --split"
            )
        path = str(inside(path, split or DEFAULT_SPLIT, "split folder"))
    files = _json_field(os.path.join(path, "state.json"), "_data_files")
    names = [f.get("filename") if isinstance(f, dict) else None for f in files]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InputError(
            f"{path}/state.json: '_data_files' is not a list of {{\"filename\": NAME}} entries"
        )
    return [str(inside(path, str(name), "file named in state.json")) for name in names]


def _json_field(path: str, key: str) -> list[Any]:
    """The list ``key`` of the JSON object in the file ``path`` (metadata ``datasets``
    writes): anything else is one :class:`InputError` naming the file (and for bad JSON the
    line and column)."""
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:  # bad JSON and bad UTF-8 are ValueErrors
        raise InputError(f"{path}: not a readable JSON file ({exc})") from exc
    value = meta.get(key) if isinstance(meta, dict) else None
    if not isinstance(value, list):
        raise InputError(f"{path}: no list {key!r} in it (damaged, or not written by datasets)")
    return value


def plan(inputs: tuple[str, ...], option: str) -> list[SourceUnit]:
    split = HfOption.parse(option).split
    names: list[str] = []
    for arg in inputs:
        if not os.path.exists(arg) and not any(c in arg for c in "*?["):
            raise InputError(
                f"{arg}: no such file or folder (a Hub dataset name is not loaded from the "
                "Hub: save it first with datasets.load_dataset(...).save_to_disk(PATH))"
            )
        is_saved = os.path.isdir(arg) and (
            os.path.exists(os.path.join(arg, "state.json"))
            or os.path.exists(os.path.join(arg, "dataset_dict.json"))
        )
        names.extend(_folder_files(arg, split) if is_saved else [arg])
    files = resolve_inputs(names, _SUFFIXES, confined=True)
    return [SourceUnit(str(f.path), f.size, f.mtime_ns) for f in files]


def _batches(path: str, span: tuple[Any, ...] = (), row: int = 0) -> tuple[Any, Iterator[Any]]:
    """The file's schema and its record batches (with ``span = (first, end)``, batches
    ``first .. end - 1`` of an Arrow file, or the rows of row groups ``first .. end - 1``
    of a Parquet file, whose first row is ``row``)."""
    schema, batches = _opened(path, span)
    return schema, _checked(path, batches, row)


def _opened(path: str, span: tuple[Any, ...]) -> tuple[Any, Iterator[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    first, end = span or (0, None)
    with _unreadable(path):
        if path.endswith(".arrow"):
            source = pa.memory_map(path)
            try:
                stream = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                count = reader.num_record_batches if end is None else end
                return reader.schema, (reader.get_batch(i) for i in range(first, count))
            # A stream is read in order; skipping a batch parses its metadata only (the
            # data stays in the memory map).
            return stream.schema, itertools.islice(stream, first, end)
        # Buffered: a column chunk is read page by page, not whole into memory.
        pf = pq.ParquetFile(path, buffer_size=PARQUET_BUFFER)
        groups = range(first, pf.metadata.num_row_groups if end is None else end)
        return pf.schema_arrow, _parquet_batches(path, pf, groups)


def _parquet_batches(path: str, pf: Any, groups: range) -> Iterator[Any]:
    """The record batches of the Parquet row groups ``groups``, each of at most about
    :data:`BATCH_BYTES` of values by the row group's metadata (a fixed 1,024 rows of
    megabyte values was a gigabyte per batch, and an ``ArrowMemoryError``). A value too
    big for the memory left is one :class:`InputError` naming the file and the column."""
    import pyarrow as pa

    meta = pf.metadata
    for g in groups:
        group = meta.row_group(g)
        rows = max(
            1, min(BATCH_ROWS, BATCH_BYTES * group.num_rows // max(group.total_byte_size, 1))
        )
        batches = pf.iter_batches(batch_size=rows, row_groups=[g], use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (MemoryError, pa.ArrowCapacityError) as exc:  # ArrowMemoryError is one
                raise InputError(_too_large(path, meta, g, exc)) from exc
            yield batch


def _too_large(path: str, meta: Any, g: int, exc: BaseException) -> str:
    """Why row group ``g`` could not be read: its biggest column (by the uncompressed size
    its metadata declares), which the error names."""
    group = meta.row_group(g)
    first = sum(meta.row_group(i).num_rows for i in range(g))
    columns = [group.column(c) for c in range(group.num_columns)]
    big = max(columns, key=lambda c: c.total_uncompressed_size)
    return (
        f"{path} rows {first}..{first + group.num_rows - 1} (row group {g}): column "
        f"{big.path_in_schema!r} is too large to read in the memory left: "
        f"{big.total_uncompressed_size:,} bytes uncompressed from {big.total_compressed_size:,} "
        f"stored, in {group.num_rows:,} rows ({type(exc).__name__}: {exc})"
    )


def _checked(path: str, batches: Iterator[Any], row: int) -> Iterator[Any]:
    """``batches``, with pyarrow's errors on a damaged file (a truncated stream, a bad page)
    as one :class:`InputError` naming the file and the row it stopped at."""
    import pyarrow as pa

    while True:
        try:
            batch = next(batches)
            # Offsets, lengths and UTF-8 checked before any value is taken: a damaged file's
            # offsets pointed reads past its buffers (a SystemError from to_pylist).
            batch.validate(full=True)
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{path} row {row}: damaged Arrow/Parquet file ({exc})") from exc
        yield batch
        row += batch.num_rows


@contextlib.contextmanager
def _unreadable(path: str) -> Iterator[None]:
    """pyarrow's errors on a file that is not Arrow or Parquet (or cannot be opened in the
    memory left) as one :class:`InputError`."""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Arrow/Parquet file ({exc})") from exc
    except MemoryError as exc:  # pyarrow's ArrowMemoryError is one
        raise InputError(
            f"{path}: cannot be opened in the memory left ({type(exc).__name__}: {exc})"
        ) from exc


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as ranges ``span = (first, end)`` of record batches (Arrow) or row groups
    (Parquet) of about ``part_bytes``; a file within one part, or of one batch, stays whole."""
    import pyarrow.parquet as pq

    if unit.nbytes <= part_bytes:
        return [unit]
    with _unreadable(unit.path):
        if unit.path.endswith(".arrow"):
            _, batches = _batches(unit.path)
            sizes = [(b.num_rows, b.nbytes) for b in batches]
        else:
            meta = pq.ParquetFile(unit.path).metadata
            groups = map(meta.row_group, range(meta.num_row_groups))
            sizes = [(g.num_rows, g.total_byte_size) for g in groups]
    total = sum(size for _, size in sizes) or 1
    parts: list[SourceUnit] = []
    first = first_row = row = held = 0  # the part being filled: from batch first, row first_row
    for i, (rows, size) in enumerate(sizes):
        held, row = held + size, row + rows
        if held >= part_bytes or i == len(sizes) - 1:
            nbytes = unit.nbytes * held // total  # the file's bytes, shared out by size
            parts.append(replace(unit, nbytes=nbytes, span=(first, i + 1), first=first_row))
            first, first_row, held = i + 1, row, 0
    if len(parts) < 2:
        return [unit]
    # The shares' rounding goes to the last part, so the parts add up to the file.
    rest = unit.nbytes - sum(p.nbytes for p in parts)
    parts[-1] = replace(parts[-1], nbytes=parts[-1].nbytes + rest)
    return parts


def features_of(schema: Any) -> dict[str, Any]:
    """The ``datasets`` features stored in an Arrow schema (empty when absent)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        return dict(json.loads(raw)["info"]["features"]) if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}


def _image(value: Any) -> Column:
    data = value.get("bytes") if isinstance(value, dict) else value
    if data is None:
        raise ValueError("image without bytes (stored by path only)")
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg", data
    return ("png", data) if data[:8] == b"\x89PNG\r\n\x1a\n" else ("bytes", data)


def _column(feature: dict[str, Any], value: Any) -> Column:
    kind = feature.get("_type")
    if kind == "Image":
        return _image(value)
    if kind == "ClassLabel" or isinstance(value, bool):
        return "int", int(value)
    if isinstance(value, list) and all(isinstance(v, int | float) for v in value):
        dtype = (feature.get("feature") or {}).get("dtype", "")
        return "ndarray", np.asarray(value, dtype=dtype or None)
    if isinstance(value, str):
        return "str", value
    if isinstance(value, int):
        return "int", value
    if isinstance(value, float):
        return "float64", np.float64(value)
    if isinstance(value, bytes):
        return "bytes", value
    return "json", value


def _records(path: str, batch: Any, features: dict[str, Any], first: int) -> Iterator[Record]:
    names, columns = batch.schema.names, []
    for name, array in zip(names, batch.columns, strict=True):
        try:  # column by column: a value too big for the memory left is named
            columns.append(array.to_pylist())
        except MemoryError as exc:
            rows = f"rows {first}..{first + batch.num_rows - 1}"
            raise InputError(
                f"{path} {rows}: column {name!r} holds values too large to convert in the "
                f"memory left ({type(exc).__name__}: {exc})"
            ) from exc
    for row, values in enumerate(zip(*columns, strict=True), first):
        sample = dict(zip(names, values, strict=True))
        where = f"{path} row {row}"
        try:
            yield where, {k: _column(features.get(k, {}), v) for k, v in sample.items()}
        except (ValueError, TypeError) as exc:
            raise InputError(f"{where}: {exc}") from exc


def read(unit: SourceUnit) -> Iterator[Record]:
    if HfOption.parse(unit.option).documents:
        for batch in read_batches(unit):
            yield from batch.records()
        return
    schema, batches = _batches(unit.path, unit.span, unit.first)
    features = features_of(schema)
    row = unit.first
    for batch in batches:
        yield from _records(unit.path, batch, features, row)
        row += batch.num_rows


def read_batches(unit: SourceUnit) -> Iterator[Batch]:
    """The records of :func:`read`, one batch per Arrow record batch: columnar where
    :func:`_plain_columns` can, else as rows."""
    schema, batches = _batches(unit.path, unit.span, unit.first)
    features = features_of(schema)
    option = HfOption.parse(unit.option)
    row = unit.first
    for batch in batches:
        if option.documents:
            yield document_batch(unit.path, row, batch, option)
            row += batch.num_rows
            continue
        where = functools.partial(_nth_where, unit.path, row)
        columns = _plain_columns(batch, features)
        if columns is not None:
            yield Batch(batch.num_rows, where, columns)
        else:
            yield Batch(batch.num_rows, where, rows=list(_records(unit.path, batch, features, row)))
        row += batch.num_rows


def _nth_where(path: str, first: int, i: int) -> str:
    return f"{path} row {first + i}"


def _plain_columns(batch: Any, features: dict[str, Any]) -> dict[str, Any] | None:
    """``batch``'s columns as :func:`_column` would encode them value by value, or ``None``
    when one of them is not plain (an image, a list, a struct, a null, a uint64)."""
    import pyarrow as pa

    columns: dict[str, tuple[str, Any]] = {}  # values: a list, or an array on axis 0
    for name, array in zip(batch.schema.names, batch.columns, strict=True):
        kind, t = features.get(name, {}).get("_type"), array.type
        if array.null_count or kind == "Image":
            return None
        if pa.types.is_boolean(t) or (pa.types.is_integer(t) and t != pa.uint64()):
            columns[name] = ("int", numbers(array).astype("<i8"))
        elif pa.types.is_floating(t):
            columns[name] = ("float64", numbers(array).astype("<f8"))
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            columns[name] = ("str", binary_views(array))  # UTF-8: checked by _checked
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            columns[name] = ("bytes", binary_views(array))
        else:
            return None
    return columns


def describe(units: list[SourceUnit]) -> dict[str, Any]:
    """``label_names`` per ClassLabel column, for the dataset metadata; and ``notes`` for
    the summary where a DatasetDict's split was taken by default (``--split`` not given),
    and of a documents import what it took from which column (and ``vocab_size``)."""
    schema, _ = _batches(units[0].path)
    option = HfOption.parse(units[0].option)
    out: dict[str, Any] = {}
    if option.documents:
        out["notes"] = notes(list(schema.names), option)
        if option.vocab_size:
            out["vocab_size"] = option.vocab_size
    else:
        names = {
            k: f["names"] for k, f in features_of(schema).items() if f.get("_type") == "ClassLabel"
        }
        out.update({"label_names": names} if names else {})
    defaulted = [] if option.split else [u.path for u in units]  # one option for every unit
    folders = dict.fromkeys(
        os.path.dirname(folder)
        for folder in map(os.path.dirname, defaulted)
        if os.path.basename(folder) == DEFAULT_SPLIT
        and os.path.exists(os.path.join(os.path.dirname(folder), "dataset_dict.json"))
    )
    if folders:
        out["notes"] = out.get("notes", []) + [
            f"split {DEFAULT_SPLIT!r} of the DatasetDict {folder} (--split not given; "
            f"its splits: {', '.join(_json_field(folder + '/dataset_dict.json', 'splits'))})"
            for folder in folders
        ]
    return out


FORMAT = ImportFormat("hf", plan, read, describe, split=split, read_batches=read_batches)
