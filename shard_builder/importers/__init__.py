"""Importers: datasets in other tools' formats -> MDS shards (``shardstream import``).

Each format module only plans its input units (files), may split a big file into parts
(:mod:`.source`), and yields samples from one unit; :mod:`.build` does the rest with the
builder's workers, journal, packing, progress bar and sink, so an import has the same
guarantees as ``shardstream build``: parallel, deterministic, resumable after a kill, and
invisible to readers until ``index.json`` is written.
``ImportConfig`` and ``build_import`` are loaded on first use, so ``shardstream --help``
does not import numpy or the format libraries.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ImportConfig", "build_import"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shardstream.shard_builder.importers import build

        return getattr(build, name)
    raise AttributeError(name)
