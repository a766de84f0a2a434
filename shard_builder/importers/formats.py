"""The import formats by name (one module each; imported lazily so optional libraries stay
optional)."""

from __future__ import annotations

import importlib

from shardstream.shard_builder.importers.source import ImportFormat

FORMATS: dict[str, str] = {
    "webdataset": "shardstream.shard_builder.importers.webdataset",
    "tfrecord": "shardstream.shard_builder.importers.tfrecord",
    "lmdb": "shardstream.shard_builder.importers.lmdb",
    "hf": "shardstream.shard_builder.importers.hf",
    "litdata": "shardstream.shard_builder.importers.litdata",
}


def get_format(name: str) -> ImportFormat:
    """The :class:`ImportFormat` called ``name`` (its module's ``FORMAT``)."""
    module = importlib.import_module(FORMATS[name])
    fmt: ImportFormat = module.FORMAT
    return fmt
