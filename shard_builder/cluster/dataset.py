"""Ray Data as the input of a build: a user's ``ray.data.Dataset``, or ``s3://`` inputs.

Text datasets have a text column; image datasets an image column (bytes, or HF datasets'
``{bytes, path}`` struct) and an integer label column.

The dataset is materialized in the cluster's object store (spilling to disk as needed)
with its row order preserved, and each of its blocks becomes one unit of work, like a
file chunk: an actor receives the block (from whichever node holds it) and tokenizes its
documents (:func:`tokenize_block`, :func:`check_block_images`: the steps the Ray driver
runs instead of the kinds' file readers). The driver holds only the blocks' references and
sizes. The block layout is part
of the build's fingerprint, so a re-run resumes from the journal only when the blocks are
the same (the same files read the same way); otherwise it refuses to mix outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder.config import ImageBuildConfig, TextBuildConfig
from shardstream.shard_builder.image_codec import column_encoding
from shardstream.shard_builder.image_source import ImageChunk, ImageSource, Item
from shardstream.shard_builder.images import CheckedImages, ImageTask, process_chunk
from shardstream.shard_builder.text import ChunkTask, ChunkTokens
from shardstream.shard_builder.tokenized import TEXT_SUFFIXES, TextSource
from shardstream.storage import open_store

_PARQUET = (".parquet", ".pq")
_BATCH = 8192  # documents per encode_batch call (as the Parquet reader's batches)


@dataclass(frozen=True)
class BlockChunk:
    """One block of a materialized dataset: a unit of work, like a file chunk."""

    number: int
    ref: Any  # the block's ObjectRef
    rows: int
    nbytes: int


def is_url(name: str) -> bool:
    """Whether an input names an object-store location (read through Ray Data)."""
    return "://" in name and not name.startswith("file://")


def url_inputs(inputs: tuple[str, ...], suffixes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every object under the ``s3://`` inputs ending in ``suffixes``: url and size, sorted
    within each input, inputs in the order given (the local builder's order rule)."""
    found: list[dict[str, Any]] = []
    for url in inputs:
        if not is_url(url):
            raise ConfigError(
                f"{url}: mix of local and object-store inputs; give all inputs as s3:// URLs "
                "(the workers read them) or all as paths"
            )
        base = url.rstrip("/")
        parent, _, name = base.rpartition("/")
        if name.lower().endswith(suffixes) and (size := open_store(parent).size(name)) is not None:
            found.append({"url": base, "size": size})
            continue
        listed = [
            {"url": f"{base}/{key}", "size": size}
            for key, size in open_store(base).list()
            if key.lower().endswith(suffixes) and not key.startswith(".")
        ]
        if not listed:
            raise InputError(f"{url}: no input files (looked for {', '.join(suffixes)} objects)")
        found.extend(listed)
    return found


def read_text_urls(ray: Any, objects: list[dict[str, Any]]) -> Any:
    """A dataset of the objects' records (JSON Lines, or Parquet), in order."""
    paths = [o["url"] for o in objects]
    parquet = [p.lower().endswith(_PARQUET) for p in paths]
    if all(parquet):
        return ray.data.read_parquet(paths)
    if not any(parquet):
        return ray.data.read_json(paths, lines=True)
    raise ConfigError("object-store inputs must be all JSON Lines or all Parquet files")


def text_source(
    ray: Any, dataset: Any, config: TextBuildConfig, lineage: list[dict[str, Any]] | None
) -> TextSource:
    """Materialize ``dataset`` (order kept) and make each block a unit of work."""
    _keep_order(dataset)
    names = list(dataset.schema().names)
    if config.field not in names:
        raise InputError(
            f"the dataset has no column {config.field!r} (columns: {', '.join(names)}); "
            "name the text column with --field / field="
        )
    refs = dataset.select_columns([config.field]).materialize().to_arrow_refs()
    # Each block's size, asked where the block lives: only two numbers travel.
    block_size = ray.remote(num_cpus=0)(_size_of_block)
    sizes = ray.get([block_size.remote(ref) for ref in refs])
    chunks = [
        BlockChunk(number, ref, rows, nbytes)
        for number, (ref, (rows, nbytes)) in enumerate(zip(refs, sizes, strict=True))
    ]
    described = lineage if lineage is not None else [{"dataset": str(dataset)}]
    source_lineage = [*described, {"blocks": [c.rows for c in chunks]}]
    return TextSource(chunks, source_lineage, [str(d.get("url", d)) for d in described])


def tokenize_block(task: ChunkTask) -> ChunkTokens:
    """A Ray actor's step on a text block (``task.chunk``, a :class:`BlockChunk`): fetch it
    from its node and tokenize its documents, as :func:`~..text.tokenize_chunk` does a file
    chunk's."""
    import ray

    chunk: BlockChunk = task.chunk
    block = ray.get(chunk.ref)
    field = task.field
    # A pyarrow.Table, or a pandas frame.
    docs = block.column(field).to_pylist() if hasattr(block, "column") else block[field].tolist()
    for row, doc in enumerate(docs):
        if not isinstance(doc, str):
            raise InputError(
                f"dataset block {chunk.number}, row {row}: column {field!r} is "
                f"{type(doc).__name__}, not a string"
            )
    tokenizer = task.tokenizer.load()
    parts = [
        tokenizer.encode_docs(docs[i : i + _BATCH]).astype(task.dtype, copy=False)
        for i in range(0, len(docs), _BATCH)
    ]
    tokens = np.concatenate(parts) if parts else np.empty(0, task.dtype)
    return ChunkTokens(tokens, len(docs))


def check_block_images(task: ImageTask) -> CheckedImages:
    """A Ray actor's step on an image chunk: a dataset block (``task.chunk.block``) is
    fetched from its node and its rows checked; a file chunk is read as a local build does."""
    if task.chunk.block is None:
        return process_chunk(task)
    import ray

    block = ray.get(task.chunk.block)
    return process_chunk(task, block_items(task.chunk, block, task.skip))


def _keep_order(dataset: Any) -> None:
    """Execute ``dataset`` with its rows in order: the token stream (or the image order)
    is the rows' order. A dataset carries the context it was made with, so its own."""
    dataset.context.execution_options.preserve_order = True


def _size_of_block(table: Any) -> tuple[int, int]:
    return int(table.num_rows), int(table.nbytes)


def text_url_source(ray: Any, config: TextBuildConfig) -> TextSource:
    """The source of a build whose inputs are ``s3://`` URLs: read by Ray Data."""
    objects = url_inputs(config.inputs, TEXT_SUFFIXES)
    return text_source(ray, read_text_urls(ray, objects), config, objects)


def image_source(
    ray: Any, dataset: Any, config: ImageBuildConfig, lineage: list[dict[str, Any]] | None
) -> tuple[ImageSource, str]:
    """Materialize an image dataset (order kept): its blocks as chunks, and the image
    encoding (``config.image_format``, or sniffed from the first image by a worker)."""
    import pyarrow as pa

    _keep_order(dataset)
    schema = dataset.schema()
    fields = {config.image_field: "--image-field", config.label_field: "--label-field"}
    for name, option in fields.items():
        if name not in schema.names:
            raise InputError(
                f"the dataset has no column {name!r} (columns: {', '.join(schema.names)}); "
                f"name it with {option}"
            )
    label_type = schema.types[schema.names.index(config.label_field)]
    if not pa.types.is_integer(label_type):
        raise InputError(
            f"dataset column {config.label_field!r} is {label_type}, not an integer: map the "
            "labels to class ids first (e.g. with Dataset.map_batches)"
        )
    refs = dataset.select_columns(list(fields)).materialize().to_arrow_refs()
    sizes = ray.get([ray.remote(num_cpus=0)(_size_of_block).remote(ref) for ref in refs])
    chunks, first = [], 0
    for number, (ref, (rows, nbytes)) in enumerate(zip(refs, sizes, strict=True)):
        chunks.append(
            ImageChunk(
                first=first,
                count=rows,
                nbytes=nbytes,
                row_group=number,
                image_field=config.image_field,
                label_field=config.label_field,
                block=ref,
            )
        )
        first += rows
    if not chunks or first == 0:
        raise InputError("the dataset holds no rows")
    encoding = config.image_format
    if encoding == "auto":
        first_block = next(c.block for c in chunks if c.count)
        encoding = ray.get(ray.remote(num_cpus=0)(_sniff_block).remote(first_block, config))
    described = lineage if lineage is not None else [{"dataset": str(dataset)}]
    source_lineage = [*described, {"blocks": [c.count for c in chunks]}]
    return ImageSource(chunks, (), frozenset(), source_lineage), encoding


def block_items(chunk: ImageChunk, block: Any, skip: int) -> Iterator[Item]:
    """The rows of an image block from row ``skip`` on, as the image builder's items."""
    images = block.column(chunk.image_field)
    if hasattr(images.type, "get_field_index"):  # HF datasets: struct {bytes, path}
        images = images.combine_chunks().field(images.type.get_field_index("bytes"))
    labels = block.column(chunk.label_field).to_pylist()
    for row in range(skip, chunk.count):
        source = f"dataset block {chunk.row_group} row {row}"
        if labels[row] is None:
            raise InputError(f"{source}: label {chunk.label_field!r} is null")
        yield chunk.first + row, source, images[row].as_py(), int(labels[row])


def _sniff_block(block: Any, config: ImageBuildConfig) -> str:
    chunk = ImageChunk(0, 1, 0, image_field=config.image_field, label_field=config.label_field)
    first = next(block_items(chunk, block, 0), None)
    return column_encoding(first[2] if first else None)
