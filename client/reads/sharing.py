"""How a partial shard gets its blocks: from the node's other processes first, else the store.

Every process of a node that reads a shard by range keeps its own file of it (a memory
file, or the cache's download file). :class:`NodeSharing` says where one partial shard
looks before fetching (the other processes' files of the same shard, and the node-wide
claims that make one process fetch a block while the others wait and copy it,
:mod:`~shardstream.client.reads.peers`) and where it leaves what it fetched (the cache's
download files). :func:`read_blocks` reads a run of blocks that way: each block a peer
holds, verified against its digest, is copied; the rest is fetched in coalesced ranges.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shardstream.client.reads.io import (
    blocks_in_place,
    offer_to_peers,
    read_peer_blocks,
    read_verified,
)
from shardstream.client.reads.ranges import coalesce

if TYPE_CHECKING:
    from shardstream.client.reads.partial import PartialShard
    from shardstream.client.reads.peers import BlockClaims

__all__ = ["NodeSharing", "read_blocks"]


@dataclass(frozen=True)
class NodeSharing:
    """Where a partial shard copies blocks from and leaves them (all optional)."""

    peers: Callable[[], list[Path]] | None = None
    """Files of this shard by other processes of the node (memory files, the cache's
    download files): a block one of them holds verified is copied, not fetched."""
    claims: BlockClaims | None = None
    """Node-wide locks over this shard's blocks: a block another process is fetching
    is waited for and copied from its file, not fetched again."""
    offer_to: Callable[[], list[Path]] | None = None
    """The node cache's download files of this shard, into which blocks fetched here
    are also written (never another process's memory)."""
    node_shared: bool = False
    """Whether this is the node cache's download file, where other processes of the
    node write verified blocks they fetched (a fill looks there before fetching)."""

    def with_downloads(self, downloads: Callable[[], list[Path]]) -> NodeSharing:
        """This sharing, also copying from and offering to the node cache's download files
        of the shard (``downloads``: another process may be filling it)."""
        peers = functools.partial(_both, downloads, self.peers)
        return dataclasses.replace(self, peers=peers, offer_to=downloads)


def read_blocks(
    partial: PartialShard, first: int, last: int
) -> list[tuple[int, bytes | bytearray]]:
    """``(file offset, bytes)`` of blocks ``first..last`` of ``partial`` to write into its
    file: each from a peer's file where one holds it verified, the rest from the store
    (coalesced, verified where the index has block digests, and offered to the cache's
    download files). Blocks the partial's own file already holds verified (the node cache's
    download file, where other processes write too) are used in place: not returned."""
    share, size, block = partial.sharing, partial.size, partial.block_size
    pieces: list[tuple[int, bytes | bytearray]] = []
    missing = np.arange(first, last + 1, dtype=np.int64)
    verify = partial.verified_on_arrival
    if verify:  # verified blocks only
        if share.node_shared and partial.fd >= 0:
            here = blocks_in_place(
                partial.fd, partial.info, missing.tolist(), block, stats=partial.stats
            )
            missing = missing[~np.isin(missing, here)]
        peers = [p for p in share.peers() if p != partial.path] if share.peers else []
        if peers and missing.size:
            found = read_peer_blocks(
                peers, partial.info, missing.tolist(), block, stats=partial.stats
            )
            pieces = [(b * block, data) for b, data in found.items()]
            missing = missing[~np.isin(missing, list(found))]
    for a, b in coalesce(missing, last - first + 1):
        span = (a * block, min((b + 1) * block, size))
        data = read_verified(
            partial.store, partial.key, partial.info, *span, stats=partial.stats, verify=verify
        )
        if verify and share.offer_to is not None:
            offer_to_peers([p for p in share.offer_to() if p != partial.path], data, span[0])
        pieces.append((span[0], data))
    return pieces


def _both(first: Callable[[], list[Path]], second: Callable[[], list[Path]] | None) -> list[Path]:
    """The files of ``first`` then those of ``second``."""
    return [*first(), *(second() if second is not None else [])]
