"""The shard format: how a writer lays out and hashes each shard, as one frozen value.

Every writer of the codec (:class:`~shardstream.mds.MDSWriter`, :func:`write_shard`,
:func:`write_shard_arrays`, :func:`write_samples`) writes shards of one
:class:`ShardFormat`: its five settings, their defaults and their checks live here once,
instead of being restated by each writer (and by each caller that forwards them). The
writers still take the five settings as keywords (``compression="zstd"``), which
override those of the ``fmt`` they are given: :data:`ShardFormatKeywords` types them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from shardstream.errors import ConfigError
from shardstream.hashing import new_hasher
from shardstream.mds._blocks import DEFAULT_BLOCK_SIZE, check_block_size
from shardstream.mds._compression import check_compression
from shardstream.mds._pieces import DEFAULT_PIECE_SIZE, check_piece_size

__all__ = [
    "MAX_SHARD_BYTES",
    "ShardFormat",
    "ShardFormatKeywords",
    "check_size_limit",
    "normalize_hashes",
]

MAX_SHARD_BYTES = 1 << 32
"""Offsets in a shard's header are uint32: a shard stays below 4 GiB."""


def normalize_hashes(hashes: Sequence[str]) -> tuple[str, ...]:
    """Sorted, de-duplicated hash names (MosaicML requires sorted); validates each name."""
    if isinstance(hashes, str):
        hashes = (hashes,)
    names = tuple(sorted(set(hashes)))
    for algo in names:
        new_hasher(algo)
    return names


def check_size_limit(size_limit: int | None) -> int | None:
    """``None`` (one shard) or a byte count in ``(0, 2**32)``; 0 means ``None`` as in MosaicML."""
    if not size_limit:
        return None
    if not isinstance(size_limit, int) or not 0 < size_limit < MAX_SHARD_BYTES:
        raise ConfigError(f"size_limit must be between 1 and 2**32 - 1 bytes, got {size_limit!r}")
    return size_limit


@dataclass(frozen=True, kw_only=True)
class ShardFormat:
    """How each shard is written; checked when made (:class:`ConfigError` naming the
    setting), with ``hashes`` sorted and a ``size_limit`` of 0 read as ``None``.

    >>> ShardFormat(compression="zstd", hashes=("xxh3_64", "sha1")).hashes
    ('sha1', 'xxh3_64')
    """

    compression: str | None = None
    """``None``, ``"zstd"`` or ``"zstd:<level>"``."""
    hashes: tuple[str, ...] = ("sha1", "xxh3_64")
    """The digests recorded per file (``shardstream.hashing``)."""
    size_limit: int | None = 128 << 20
    """The largest shard file in bytes (``None``: one shard)."""
    block_size: int | None = DEFAULT_BLOCK_SIZE
    """Bytes per block digest for ranged reads of uncompressed shards (``None``: none, and
    the index is byte-identical to MosaicML's)."""
    piece_size: int | None = DEFAULT_PIECE_SIZE
    """Bytes per piece digest in each shard's header (``None``: none, and the shards are
    byte-identical to MosaicML's)."""

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        check_piece_size(self.piece_size)
        check_compression(self.compression, writing=True)
        object.__setattr__(self, "hashes", normalize_hashes(self.hashes))
        object.__setattr__(self, "size_limit", check_size_limit(self.size_limit))

    def with_keywords(self, keywords: ShardFormatKeywords) -> ShardFormat:
        """This format with the settings a writer was given as keywords."""
        if not keywords:
            return self
        settings: dict[str, Any] = dict(keywords)  # hashes: any sequence, sorted on the way
        return dataclasses.replace(self, **settings)


class ShardFormatKeywords(TypedDict, total=False):
    """The :class:`ShardFormat` settings a writer accepts as keywords."""

    compression: str | None
    hashes: Sequence[str]
    size_limit: int | None
    block_size: int | None
    piece_size: int | None


DEFAULT_FORMAT = ShardFormat()
"""The builder's and MosaicML's defaults: no compression, sha1 and xxh3_64, 128 MiB
shards, 4 MiB blocks, 64 KiB pieces."""
