"""Build one whole batch from memory-mapped shards: one vectorized gather per shard run.

A batch's samples come from many shards (the plan mixes them). Instead of reading and
collating samples one by one, the builder groups the batch's positions by shard and, for
every fixed-size column, copies each group with a single
:meth:`~shardstream.mds.ShardReader.gather` straight into the output array (which the
fast loader places in shared memory, so the batch is written exactly once). Variable-size
columns (``str``, ``bytes``, ``json``, images) are read per sample; images are decoded
(:mod:`image_decode`) and stacked when they share a shape, or left as bytes for a
per-sample transform (:mod:`sample_transform`) to decode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from shardstream.client.batches.decode import IMAGE_ENCODINGS, stack_or_list
from shardstream.client.batches.image_decode import ImageDecoder
from shardstream.client.options import DecodeOptions
from shardstream.errors import ConfigError
from shardstream.mds import ShardInfo, ShardReader

__all__ = ["Allocator", "BatchBuilder", "ColumnSpec", "numpy_allocator"]

SAMPLE_ID = "sample_id"
"""Batch key of the global sample ids (with ``DecodeOptions(sample_ids=True)``)."""


class Allocator(Protocol):
    """Returns an uninitialized array for a batch column (``name``, ``shape``, ``dtype``)."""

    def __call__(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> np.ndarray[Any, Any]: ...


def numpy_allocator(
    name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """Plain private memory (the default outside the fast loader)."""
    return np.empty(shape, dtype)


class ColumnSpec:
    """The columns a batch holds, checked to be identical across the mixture's sources."""

    def __init__(self, shards: Sequence[tuple[str, ShardInfo]], options: DecodeOptions) -> None:
        where, first = shards[0]
        columns = first.columns
        sizes = dict(zip(first.column_names, first.column_sizes, strict=True))
        for other_where, shard in shards[1:]:
            if shard.columns != columns:
                raise ConfigError(
                    f"{other_where} has columns {shard.columns}, but {where} has {columns}; "
                    "every source of a mixture needs the same columns and encodings"
                )
        wanted = options.columns if options.columns is not None else tuple(columns)
        for name in wanted:
            if name not in columns:
                raise ConfigError(
                    f"DecodeOptions.columns names {name!r}, which {where} does not have; "
                    f"its columns are {sorted(columns)}"
                )
        if options.sample_ids and SAMPLE_ID in wanted:
            raise ConfigError(f"a column is named {SAMPLE_ID!r}; turn off DecodeOptions.sample_ids")
        self.names = tuple(wanted)
        self.encodings = {name: columns[name] for name in wanted}
        self.fixed = tuple(name for name in wanted if sizes[name] is not None)
        self.variable = tuple(name for name in wanted if sizes[name] is None)
        self.options = options


class BatchBuilder:
    """Gathers the samples ``(shard, index)`` of a chunk of batches into column arrays."""

    def __init__(self, spec: ColumnSpec, *, decode_images: bool | None = None) -> None:
        self._spec = spec
        self._decode_images = spec.options.decode_images if decode_images is None else decode_images
        self._decoder = ImageDecoder.of(spec.options)

    def build(
        self,
        shards: np.ndarray[Any, Any],
        indices: np.ndarray[Any, Any],
        reader: Callable[[int], ShardReader],
        *,
        sample_ids: np.ndarray[Any, Any] | None = None,
        alloc: Allocator = numpy_allocator,
    ) -> list[dict[str, Any]]:
        """Batches of samples ``indices[k, i]`` of shard ``shards[k, i]`` (``k``: batch).

        The whole ``(K, n)`` chunk is gathered at once: one ``gather`` per shard run of the
        chunk and column, so numpy's per-call overhead is paid per chunk, not per batch.
        Returns ``K`` dicts whose fixed-size arrays are views of one ``(K, n, ...)`` block.
        """
        k, n = shards.shape
        flat_shards = shards.reshape(-1)
        flat_indices = indices.reshape(-1)
        total = k * n
        order = np.argsort(flat_shards, kind="stable")
        sorted_shards = flat_shards[order]
        cuts = np.flatnonzero(sorted_shards[1:] != sorted_shards[:-1]) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), total]
        blocks: dict[str, np.ndarray[Any, Any]] = {}
        variable: dict[str, list[Any]] = {name: [None] * total for name in self._spec.variable}
        for start, end in zip(starts, ends, strict=True):
            positions = order[start:end]
            local = flat_indices[positions]
            shard = int(sorted_shards[start])
            rd = reader(shard)
            for name in self._spec.fixed:
                values = rd.gather(name, local)
                block = blocks.get(name)
                if block is None:
                    block = alloc(name, (k, n, *values.shape[1:]), values.dtype)
                    blocks[name] = block
                block.reshape(total, *values.shape[1:])[positions] = values
            for name in self._spec.variable:
                column = variable[name]
                for pos, idx in zip(positions.tolist(), local.tolist(), strict=True):
                    column[pos] = self._decode(name, rd[idx][name], shard, idx)
        if sample_ids is not None:
            ids = alloc(SAMPLE_ID, (k, n), np.dtype(np.int64))
            ids[...] = sample_ids
            blocks[SAMPLE_ID] = ids
        names = (*self._spec.names, *([SAMPLE_ID] if sample_ids is not None else []))
        batches: list[dict[str, Any]] = []
        for row in range(k):
            batch: dict[str, Any] = {}
            for name in names:
                if name in blocks:
                    batch[name] = blocks[name][row]
                else:
                    batch[name] = stack_or_list(variable[name][row * n : (row + 1) * n])
            batches.append(batch)
        return batches

    def _decode(self, name: str, value: Any, shard: int, idx: int) -> Any:
        encoding = self._spec.encodings[name]
        if (
            encoding in IMAGE_ENCODINGS
            and self._decode_images
            and isinstance(value, bytes | bytearray | memoryview)
        ):
            return self._decoder(bytes(value), what=f"shard {shard} sample {idx} column {name!r}")
        return value
