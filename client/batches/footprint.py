"""How much node cache a job needs: the shards its readers hold at once, and their bytes.

A reader (the main process, or one DataLoader worker) pins every shard the chunk of
batches it is building reads from, on top of those it kept from the chunk before (all of
that chunk's shards, or ``open_shards`` if more); while it reads, ``prefetch_shards``
more are being downloaded into the cache. So::

    shards per reader = most shards pinned while building a chunk + prefetch_shards
                      (about max(open_shards, shards one chunk reads) + shards one chunk reads)
    shards per rank   = shards per reader x readers per rank (DataLoader workers, or 1)
    shards per node   = shards per rank x ranks per node (LOCAL_WORLD_SIZE)
    bytes per node    = the largest shards' bytes, that many of them

``open_shards`` is a minimum, not a cap: how many shards one chunk reads depends on the
plan (its mixing window interleaves many shards in every batch, more when shards are
small), so it is measured on the plan itself: the reader's leases are replayed (the same
keep-and-release rule as :class:`~shardstream.client.reads.leases.ShardLeases`) over the
chunks of the first :data:`SAMPLED_BATCHES` batches it builds. A cache limit below
``bytes per node`` either goes over its limit (pinned shards cannot be evicted) or evicts
prefetched shards before they are read, which downloads them twice.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shardstream.client.batches.stream import BatchStream

__all__ = ["SAMPLED_BATCHES", "CacheFootprint", "compute_footprint", "warn_if_too_small"]

log = logging.getLogger(__name__)

SAMPLED_BATCHES = 512
"""Batches of the epoch whose chunks are measured (enough for a stationary plan)."""


@dataclass(frozen=True)
class CacheFootprint:
    """The node cache a job holds at once for its plan and cache options.

    >>> ds.footprint(num_workers=4)  # doctest: +SKIP
    CacheFootprint(shards_per_chunk=37, shards_per_reader=39, readers_per_rank=4, ...)
    """

    shards_per_chunk: int
    """Most distinct shards one chunk of batches reads (measured on the plan)."""
    shards_pinned: int
    """Most shards one reader pins at once: a chunk's, plus those kept from the last."""
    shards_per_reader: int
    """``shards_pinned + prefetch_shards``."""
    readers_per_rank: int
    """DataLoader workers per rank (1 without workers)."""
    ranks_per_node: int
    """Ranks sharing the node's cache (``LOCAL_WORLD_SIZE``, else 1)."""
    shards_per_node: int
    """Shards held at once on the node, at most every shard of the sources."""
    bytes_per_node: int
    """The bytes of that many of the largest shards: set ``limit_bytes`` at least this."""

    @property
    def shards_per_rank(self) -> int:
        """Shards held at once by one rank's readers."""
        return self.shards_per_reader * self.readers_per_rank


def compute_footprint(stream: BatchStream, num_workers: int = 0, epoch: int = 0) -> CacheFootprint:
    """The footprint of ``stream``'s rank with ``num_workers`` DataLoader workers per rank."""
    from shardstream.client.batches.stream import MAX_CHUNK, _planned

    options = stream.cache_options
    readers = max(1, num_workers)
    plan = stream.plan(epoch)
    rank, world = stream.topology.rank, stream.topology.world_size
    per_chunk = pinned = seen = 0
    held: OrderedDict[int, None] = OrderedDict()  # this reader's leases, least recent first
    for bs, _, shards, _ in _planned(plan, rank, world, 0, step=readers, max_chunk=MAX_CHUNK):
        needed = [int(s) for s in np.unique(shards)]
        per_chunk = max(per_chunk, len(needed))
        for shard in needed:
            held[shard] = None
            held.move_to_end(shard)
        pinned = max(pinned, len(held))
        excess = len(held) - max(options.open_shards, len(needed))
        for shard in [s for s in held if s not in set(needed)][: max(excess, 0)]:
            del held[shard]
        seen += len(bs)
        if seen >= SAMPLED_BATCHES:
            break
    per_reader = pinned + stream.read_options.prefetch_shards
    ranks = stream.topology.local_world_size or 1
    sizes = np.sort(
        np.array([s.raw_data.bytes for src in stream.sources for s in src.shards], np.int64)
    )[::-1]
    per_node = min(per_reader * readers * ranks, int(sizes.size))
    return CacheFootprint(
        shards_per_chunk=per_chunk,
        shards_pinned=pinned,
        shards_per_reader=per_reader,
        readers_per_rank=readers,
        ranks_per_node=ranks,
        shards_per_node=per_node,
        bytes_per_node=int(sizes[:per_node].sum()),
    )


def warn_if_too_small(stream: BatchStream, num_workers: int) -> CacheFootprint | None:
    """Log a warning when the cache limit is below the job's footprint; returns it then."""
    limit = stream.cache_options.limit_bytes
    if limit is None:
        return None
    need = compute_footprint(stream, num_workers)
    if limit >= need.bytes_per_node:
        return None
    log.warning(
        "cache limit %d bytes is below what this job holds at once on a node: %d bytes "
        "(%d shards per reader [%d pinned while building a chunk + prefetch_shards] x "
        "%d readers per rank x %d ranks per node); pinned shards will push the cache over "
        "its limit and prefetched ones will be downloaded twice. Raise "
        "CacheOptions.limit_bytes to at least %d (see docs/cache.md, Sizing)",
        limit,
        need.bytes_per_node,
        need.shards_per_reader,
        need.shards_pinned,
        need.readers_per_rank,
        need.ranks_per_node,
        need.bytes_per_node,
    )
    return need
