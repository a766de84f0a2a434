"""Hugging Face ``datasets`` folders (``save_to_disk``) and Arrow/Parquet files.

A ``Dataset.save_to_disk`` folder lists its Arrow files in ``state.json``; a
``DatasetDict`` folder holds one such folder per split (chosen with ``--split``). Features
(kept by ``datasets`` in the Arrow schema metadata) map to MDS columns: ``Image`` -> the
encoded image bytes (``jpeg``/``png`` when every value is one, else ``bytes``),
``ClassLabel`` -> int (names kept in the dataset metadata as ``label_names``), a list of
ints/floats -> ndarray, string -> str, int -> int, float -> float64, bool -> int,
anything else -> json. Loading by Hub name is not supported: save the dataset to disk
first (``datasets.load_dataset(...).save_to_disk(path)``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import Column, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.inputs import resolve_inputs

_SUFFIXES = (".arrow", ".parquet", ".pq")


def _folder_files(path: str, split: str) -> list[str]:
    if os.path.exists(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise InputError(
                f"{path}: a DatasetDict with splits {', '.join(splits)}; choose one with --split"
            )
        path = os.path.join(path, split)
    with open(os.path.join(path, "state.json")) as f:
        return [os.path.join(path, d["filename"]) for d in json.load(f)["_data_files"]]


def plan(inputs: tuple[str, ...], split: str) -> list[SourceUnit]:
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
    return [SourceUnit(str(f.path), f.size, f.mtime_ns) for f in resolve_inputs(names, _SUFFIXES)]


def _batches(path: str) -> tuple[Any, Iterator[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.endswith(".arrow"):
            source = pa.memory_map(path)
            try:
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                return reader.schema, (
                    reader.get_batch(i) for i in range(reader.num_record_batches)
                )
            return reader.schema, iter(reader)
        pf = pq.ParquetFile(path)
        return pf.schema_arrow, pf.iter_batches(batch_size=1024)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Arrow/Parquet file ({exc})") from exc


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


def read(unit: SourceUnit) -> Iterator[Record]:
    schema, batches = _batches(unit.path)
    features = features_of(schema)
    row = 0
    for batch in batches:
        for sample in batch.to_pylist():
            where = f"{unit.path} row {row}"
            try:
                yield where, {k: _column(features.get(k, {}), v) for k, v in sample.items()}
            except (ValueError, TypeError) as exc:
                raise InputError(f"{where}: {exc}") from exc
            row += 1


def label_names(units: list[SourceUnit]) -> dict[str, Any]:
    """``label_names`` per ClassLabel column, for the dataset metadata."""
    schema, _ = _batches(units[0].path)
    names = {
        k: f["names"] for k, f in features_of(schema).items() if f.get("_type") == "ClassLabel"
    }
    return {"label_names": names} if names else {}


FORMAT = ImportFormat("hf", plan, read, label_names)
