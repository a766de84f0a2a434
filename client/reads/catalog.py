"""The shards a read path reads, by the epoch plan's global shard index.

The epoch plan numbers the shards of all the sources it mixes as one list (the sources'
shard lists concatenated in source order); a read path maps that number back to the
source, its index entry and the node cache's key through one :class:`ShardCatalog`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shardstream.client.sources.source import ResolvedSource
from shardstream.mds import ShardInfo

__all__ = ["ShardCatalog"]


class ShardCatalog:
    """The shards of one or more sources by *global* index: the sources' shard lists
    concatenated in source order, as the epoch plan numbers them. Never changes."""

    def __init__(self, sources: Sequence[ResolvedSource]) -> None:
        self.sources = list(sources)
        counts = [len(s.shards) for s in self.sources]
        self._offsets: npt.NDArray[np.int64] = np.concatenate([[0], np.cumsum(counts)]).astype(
            np.int64
        )

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, shard: int) -> tuple[ResolvedSource, int]:
        """(source, shard index within it) of a global shard index."""
        src = int(np.searchsorted(self._offsets, shard, side="right")) - 1
        return self.sources[src], shard - int(self._offsets[src])

    def info(self, shard: int) -> ShardInfo:
        """The index entry of ``shard``."""
        source, local = self.locate(shard)
        return source.shards[local]

    def cache_key(self, shard: int) -> str:
        """The node cache's key of ``shard``."""
        source, local = self.locate(shard)
        return source.cache_key(local)
