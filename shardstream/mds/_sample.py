"""One sample's MDS bytes: the uint32 sizes of its variable-size columns, then every column.

Columns are sorted by name, as MosaicML writes them. Encoders are built once per column
set (:func:`make_encoder`), because the per-sample path is the builder's hot loop.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping
from typing import Any

from shardstream.errors import ConfigError, InputError
from shardstream.mds._encodings import Codec, get_codec

PartsEncoder = Callable[[Mapping[str, Any]], tuple[list[bytes], int]]


@functools.lru_cache(maxsize=64)
def _parse_columns(items: tuple[tuple[str, str], ...]) -> tuple[tuple[str, Codec], ...]:
    for name, _ in items:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"column names must be non-empty strings, got {name!r}")
    # Shard order is sorted by name, as MosaicML writes it.
    return tuple((name, get_codec(encoding)) for name, encoding in sorted(items))


def parse_columns(columns: Mapping[str, str]) -> tuple[tuple[str, Codec], ...]:
    """Validate ``columns`` (name -> encoding) and return ``(name, codec)`` sorted by name."""
    if not columns:
        raise ConfigError("a shard needs at least one column")
    return _parse_columns(tuple(columns.items()))


def make_parts_encoder(columns: Mapping[str, str]) -> PartsEncoder:
    """A ``sample -> (parts, size)`` function: the sample's bytes as separate pieces.

    Joining the pieces gives :func:`encode_sample`'s bytes; keeping them apart lets the
    writer avoid copying large values (images) once per sample.
    """
    cols = parse_columns(columns)
    nvar = sum(codec.size is None for _, codec in cols)
    pack = struct.Struct(f"<{nvar}I").pack
    names = [name for name, _ in cols]

    def encode(sample: Mapping[str, Any]) -> tuple[list[bytes], int]:
        sizes: list[int] = []
        parts: list[bytes] = []
        total = 4 * nvar
        for name, codec in cols:
            try:
                value = sample[name]
            except KeyError:
                raise InputError(
                    f"sample has no column {name!r} (it has {sorted(sample)}); every sample "
                    f"needs all columns {names}"
                ) from None
            except TypeError:
                raise InputError(
                    f"a sample must map column names to values, got {type(sample).__name__}"
                ) from None
            try:
                data = value if type(value) is bytes else codec.encode(value)
            except InputError as exc:
                raise InputError(f"column {name!r} ({codec.encoding}): {exc}") from None
            if codec.size is None:
                sizes.append(len(data))
            elif len(data) != codec.size:
                raise InputError(
                    f"column {name!r} ({codec.encoding}): encoded size is {len(data)} bytes, "
                    f"expected {codec.size}"
                )
            parts.append(data)
            total += len(data)
        if nvar:
            parts.insert(0, pack(*sizes))
        return parts, total

    return encode


def make_encoder(columns: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bytes]:
    """A fast ``sample -> bytes`` function for ``columns`` (see :func:`encode_sample`)."""
    encode_parts = make_parts_encoder(columns)

    def encode(sample: Mapping[str, Any]) -> bytes:
        parts, _ = encode_parts(sample)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    return encode


def encode_sample(columns: Mapping[str, str], sample: Mapping[str, Any]) -> bytes:
    """One sample's MDS bytes (sizes of variable columns, then every column, sorted by name).

    Raises :class:`InputError` naming the column for a missing column or a bad value.
    For many samples, call :func:`make_encoder` once and reuse it.
    """
    return _cached_encoder(tuple(columns.items()))(sample)


@functools.lru_cache(maxsize=16)
def _cached_encoder(items: tuple[tuple[str, str], ...]) -> Callable[[Mapping[str, Any]], bytes]:
    return make_encoder(dict(items))
