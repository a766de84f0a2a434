"""Where images come from: an ImageNet-style folder, or Parquet files with bytes + label.

Both sources number their items globally (folder: sorted class, then sorted file name;
Parquet: files in order, rows in order) and are split into chunks of consecutive items
that worker processes decode in parallel. A chunk yields ``(item number, source name,
image bytes or None, label)``; the source name (path, or ``file.parquet row N``) is what
error messages and the skip report show.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstream.errors import InputError
from shardstream.shard_builder.inputs import InputFile, resolve_inputs

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PARQUET_SUFFIXES = (".parquet", ".pq")
FOLDER_CHUNK_ITEMS = 64
_PARQUET_BATCH_ROWS = 256

Item = tuple[int, str, bytes | None, int]


@dataclass(frozen=True)
class ImageChunk:
    """Consecutive items ``[first, first + count)``: folder files, or one Parquet row group."""

    first: int
    count: int
    nbytes: int
    files: tuple[tuple[str, int], ...] = ()  # folder: (path, label) per item
    parquet: str = ""  # parquet: the file
    row_group: int = 0
    image_field: str = "image"
    label_field: str = "label"
    label_names: tuple[str, ...] = ()  # parquet string labels: id = position here
    block: Any = None  # a Ray Data block's ObjectRef (the Ray builder reads it)


@dataclass(frozen=True)
class ImageSource:
    """The planned input of an image build."""

    chunks: list[ImageChunk]
    label_names: tuple[str, ...]
    extensions: frozenset[str]  # folder: file suffixes seen; parquet: empty
    lineage: list[dict[str, Any]]


def plan_images(inputs: Sequence[str], image_field: str, label_field: str) -> ImageSource:
    """Plan a build from one image folder or from Parquet files."""
    if len(inputs) == 1 and Path(inputs[0]).is_dir() and _has_class_dirs(Path(inputs[0])):
        return _plan_folder(Path(inputs[0]))
    files = resolve_inputs(inputs, PARQUET_SUFFIXES)
    for f in files:
        if not f.path.name.lower().endswith(PARQUET_SUFFIXES):
            raise InputError(
                f"{f.path}: not a Parquet file; image inputs are one folder with a "
                "sub-folder per class, or Parquet files with image bytes and a label"
            )
    return _plan_parquet(files, image_field, label_field)


def _has_class_dirs(root: Path) -> bool:
    return any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir())


def _plan_folder(root: Path) -> ImageSource:
    # Plain strings and os.walk: pathlib objects per file dominate planning a folder of a
    # million images.
    top = os.path.abspath(root)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    entries: list[tuple[str, int]] = []
    listing = hashlib.sha256()
    total = 0
    sizes: list[int] = []
    for label, name in enumerate(classes):
        for dirpath, dirs, names in os.walk(os.path.join(top, name)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for file_name in sorted(names):
                if not file_name.lower().endswith(IMAGE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, file_name)
                try:
                    st = os.stat(path)
                except OSError as exc:
                    raise InputError(f"{path}: cannot read the image ({exc.strerror})") from exc
                listing.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                entries.append((path, label))
                sizes.append(st.st_size)
                total += st.st_size
    if not entries:
        raise InputError(
            f"{root}: no images found (looked for {', '.join(IMAGE_SUFFIXES)} files in "
            f"the class folders {', '.join(classes[:5])})"
        )
    chunks = [
        ImageChunk(
            first=first,
            count=len(entries[first : first + FOLDER_CHUNK_ITEMS]),
            nbytes=sum(sizes[first : first + FOLDER_CHUNK_ITEMS]),
            files=tuple(entries[first : first + FOLDER_CHUNK_ITEMS]),
        )
        for first in range(0, len(entries), FOLDER_CHUNK_ITEMS)
    ]
    suffixes = frozenset(os.path.splitext(path)[1].lower() for path, _ in entries)
    # A folder can hold millions of files: lineage is a digest of the listing.
    lineage = {
        "path": top,
        "files": len(entries),
        "size": total,
        "listing_sha256": listing.hexdigest(),
    }
    return ImageSource(chunks, tuple(classes), suffixes, [lineage])


def _open(path: Path) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # ArrowInvalid, OSError, ...
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc


def _plan_parquet(files: list[InputFile], image_field: str, label_field: str) -> ImageSource:
    import pyarrow as pa

    chunks: list[ImageChunk] = []
    string_labels: set[str] = set()
    label_kinds: set[str] = set()
    hf_names: tuple[str, ...] = ()
    first = 0
    for f in files:
        pf = _open(f.path)
        schema = pf.schema_arrow
        for name in (image_field, label_field):
            if name not in schema.names:
                raise InputError(
                    f"{f.path}: no column {name!r} (columns: {', '.join(schema.names)}); "
                    "name the columns with --image-field / --label-field"
                )
        label_type = schema.field(label_field).type
        if pa.types.is_integer(label_type):
            label_kinds.add("int")
            hf_names = hf_names or _hf_class_names(schema, label_field)
        elif pa.types.is_string(label_type) or pa.types.is_large_string(label_type):
            label_kinds.add("str")
            string_labels.update(_distinct_strings(pf, f.path, label_field))
        else:
            raise InputError(f"{f.path}: label column {label_field!r} is {label_type}, not int/str")
        groups = pf.metadata.num_row_groups
        for rg in range(groups):
            rows = pf.metadata.row_group(rg).num_rows
            share = f.size // max(groups, 1)
            chunks.append(
                ImageChunk(first, rows, share, (), str(f.path), rg, image_field, label_field)
            )
            first += rows
    if len(label_kinds) > 1:
        raise InputError(f"label column {label_field!r} is int in some files, string in others")
    names = tuple(sorted(string_labels)) if "str" in label_kinds else hf_names
    if names and "str" in label_kinds:
        chunks = [_with_names(c, names) for c in chunks]
    return ImageSource(chunks, names, frozenset(), [f.lineage() for f in files])


def _with_names(chunk: ImageChunk, names: tuple[str, ...]) -> ImageChunk:
    from dataclasses import replace

    return replace(chunk, label_names=names)


def _hf_class_names(schema: Any, label_field: str) -> tuple[str, ...]:
    # HF datasets stores ClassLabel names in the schema metadata: keep them when present.
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return ()
    try:
        feature = json.loads(raw)["info"]["features"][label_field]
        return tuple(str(n) for n in feature["names"])
    except (TypeError, ValueError, KeyError):
        return ()


def _distinct_strings(pf: Any, path: Path, field: str) -> set[str]:
    out: set[str] = set()
    for batch in pf.iter_batches(batch_size=65536, columns=[field]):
        column = batch.column(0)
        if column.null_count:
            raise InputError(f"{path}: label column {field!r} has null values")
        out.update(column.unique().to_pylist())
    return out


def read_items(chunk: ImageChunk, skip: int = 0) -> Iterator[Item]:
    """The chunk's items from number ``chunk.first + skip`` on."""
    if chunk.files:
        for number, (path, label) in enumerate(chunk.files[skip:], start=chunk.first + skip):
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                raise InputError(f"{path}: cannot read the image ({exc.strerror})") from exc
            yield number, path, data, label
        return
    yield from _parquet_items(chunk, skip)


def _parquet_items(chunk: ImageChunk, skip: int) -> Iterator[Item]:
    pf = _open(Path(chunk.parquet))
    lookup = {name: i for i, name in enumerate(chunk.label_names)}
    number = chunk.first
    batches = pf.iter_batches(
        batch_size=_PARQUET_BATCH_ROWS,
        row_groups=[chunk.row_group],
        columns=[chunk.image_field, chunk.label_field],
    )
    try:
        for batch in batches:
            images = batch.column(0)
            if hasattr(images.type, "get_field_index"):  # HF datasets: struct {bytes, path}
                images = images.field(images.type.get_field_index("bytes"))
            for image, label in zip(images.to_pylist(), batch.column(1).to_pylist(), strict=True):
                source = f"{chunk.parquet} row {number}"
                if number >= chunk.first + skip:
                    if label is None:
                        raise InputError(f"{source}: label {chunk.label_field!r} is null")
                    label_id = lookup[label] if isinstance(label, str) else int(label)
                    yield number, source, image, label_id
                number += 1
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"{chunk.parquet}: row group {chunk.row_group} cannot be read near row {number} ({exc})"
        ) from exc
