"""Build one whole batch from memory-mapped shards: one vectorized gather per shard run.

A batch's samples come from many shards (the plan mixes them). Instead of reading and
collating samples one by one, the builder groups the batch's positions by shard and, for
every fixed-size column, copies each group with a single
:meth:`~shardstream.mds.ShardReader.gather` straight into the output array (which the
fast loader places in shared memory, so the batch is written exactly once). Variable-size
columns (``str``, ``bytes``, ``json``, images) are read per sample; images are decoded
with Pillow and stacked when they share a shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from shardstream.client.decode import IMAGE_ENCODINGS, decode_image, stack_or_list
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
    """Gathers the samples ``(shard, index)`` of one batch into column arrays."""

    def __init__(self, spec: ColumnSpec) -> None:
        self._spec = spec

    def build(
        self,
        shards: np.ndarray[Any, Any],
        indices: np.ndarray[Any, Any],
        reader: Callable[[int], ShardReader],
        *,
        sample_ids: np.ndarray[Any, Any] | None = None,
        alloc: Allocator = numpy_allocator,
    ) -> dict[str, Any]:
        """The batch of samples ``indices[i]`` of shard ``shards[i]``, in that order."""
        n = len(shards)
        order = np.argsort(shards, kind="stable")
        sorted_shards = shards[order]
        cuts = np.flatnonzero(np.diff(sorted_shards)) + 1
        starts = np.concatenate([[0], cuts]).tolist()
        ends = [*cuts.tolist(), n]
        out: dict[str, Any] = {}
        variable: dict[str, list[Any]] = {name: [None] * n for name in self._spec.variable}
        for start, end in zip(starts, ends, strict=True):
            positions = order[start:end]
            local = indices[positions]
            shard = int(sorted_shards[start])
            rd = reader(shard)
            whole = end - start == n and bool(np.all(np.diff(positions) == 1))
            for name in self._spec.fixed:
                values = rd.gather(name, local)
                if name not in out:
                    out[name] = alloc(name, (n, *values.shape[1:]), values.dtype)
                # One run covering the batch in order needs no scatter, just one copy.
                if whole:
                    out[name][...] = values
                else:
                    out[name][positions] = values
            for name in self._spec.variable:
                column = variable[name]
                for pos, idx in zip(positions.tolist(), local.tolist(), strict=True):
                    column[pos] = self._decode(name, rd[idx][name], shard, idx)
        for name in self._spec.variable:
            out[name] = stack_or_list(variable[name])
        if sample_ids is not None:
            ids = alloc(SAMPLE_ID, (n,), np.dtype(np.int64))
            ids[...] = sample_ids
            out[SAMPLE_ID] = ids
        return {name: out[name] for name in (*self._spec.names, *_extra(out))}

    def _decode(self, name: str, value: Any, shard: int, idx: int) -> Any:
        encoding = self._spec.encodings[name]
        if (
            encoding in IMAGE_ENCODINGS
            and self._spec.options.decode_images
            and isinstance(value, bytes | bytearray | memoryview)
        ):
            return decode_image(bytes(value), what=f"shard {shard} sample {idx} column {name!r}")
        return value


def _extra(out: Mapping[str, Any]) -> list[str]:
    return [SAMPLE_ID] if SAMPLE_ID in out else []
