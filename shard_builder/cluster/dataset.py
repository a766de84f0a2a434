"""Ray Data as the input of a build: a user's ``ray.data.Dataset``, or ``s3://`` inputs.

The dataset is materialized in the cluster's object store (spilling to disk as needed)
with its row order preserved, and each of its blocks becomes one unit of work, like a
file chunk: an actor receives the block (from whichever node holds it) and tokenizes its
documents. The driver holds only the blocks' references and sizes. The block layout is part
of the build's fingerprint, so a re-run resumes from the journal only when the blocks are
the same (the same files read the same way); otherwise it refuses to mix outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.text import TEXT_SUFFIXES, TextSource
from shardstream.storage import open_store

_PARQUET = (".parquet", ".pq")


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
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # the token stream is the rows' order
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


def _size_of_block(table: Any) -> tuple[int, int]:
    return int(table.num_rows), int(table.nbytes)


def text_url_source(ray: Any, config: TextBuildConfig) -> TextSource:
    """The source of a build whose inputs are ``s3://`` URLs: read by Ray Data."""
    objects = url_inputs(config.inputs, TEXT_SUFFIXES)
    return text_source(ray, read_text_urls(ray, objects), config, objects)
