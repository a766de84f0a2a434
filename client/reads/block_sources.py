"""How a partial shard gets its blocks: from the node's other processes first, else the store.

Every process of a node that reads a shard by range keeps a file of it: a memory file of
its own, or the cache's download file, which the filling process and the node's other
readers of the shard share (:meth:`MemoryShards.join`). :class:`NodeSharing` says where
one partial shard looks before fetching (its own file when it is the shared download file,
the other processes' files of the same shard, and the node-wide claims that make one
process fetch a block while the others wait for it, :mod:`~shardstream.client.reads.peer_files`)
and where it leaves what it fetched (the cache's download files). :func:`read_blocks`
reads a run of blocks that way: a block the shared file holds verified is used where it
lies (:func:`blocks_in_place`), one another process's file holds is copied
(:func:`read_peer_blocks`), the rest is fetched in coalesced ranges and offered to the
download files (:func:`offer_to_peers`). A peer's block may be a hole or half written:
its digest decides.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shardstream.client.cache.layout import CacheLayout
from shardstream.client.reads.io import BlockStats, pwrite_all, read_verified
from shardstream.client.reads.ranges import coalesce
from shardstream.errors import CorruptShardError
from shardstream.mds import ShardInfo

if TYPE_CHECKING:
    from shardstream.client.reads.partial import PartialShard
    from shardstream.client.reads.peer_files import BlockClaims

__all__ = ["NodeSharing", "blocks_in_place", "offer_to_peers", "read_blocks", "read_peer_blocks"]


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
            offer_to_peers(share.offer_to(), data, span[0])
        pieces.append((span[0], data))
    return pieces


def _both(first: Callable[[], list[Path]], second: Callable[[], list[Path]] | None) -> list[Path]:
    """The files of ``first`` then those of ``second``."""
    return [*first(), *(second() if second is not None else [])]


def read_peer_blocks(
    peers: Sequence[Path],
    info: ShardInfo,
    blocks: Sequence[int],
    block_size: int,
    *,
    stats: BlockStats,
) -> dict[int, bytes]:
    """Those of ``blocks`` (sorted) that other processes' files of the same shard hold,
    each matching its digest: ``{block: bytes}`` (counted as ``peer_bytes``); the rest
    must be fetched.

    Block by block, not all or nothing: a peer that fetched block 3 for a batch serves it to
    a process whose fill wants blocks 3..4, which then fetches only block 4. A peer's
    block may be a hole (zeros) or half written when read here: the digest check is what
    makes the bytes safe to use."""
    size = info.raw_data.bytes
    found: dict[int, bytes] = {}
    for path in peers:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # published or abandoned meanwhile
        try:
            wanted = [b for b in blocks if b not in found]
            with_data = np.asarray(_blocks_with_data(fd, wanted, block_size, size), np.int64)
            for a, b in coalesce(with_data, len(wanted)):
                start, end = a * block_size, min((b + 1) * block_size, size)
                data = os.pread(fd, end - start, start)  # checked as copied, not before
                for block in _verified(info, start, memoryview(data), range(a, b + 1), block_size):
                    at = block * block_size - start
                    found[block] = data if a == b else data[at : at + block_size]
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(found) == len(blocks):
            break
    if found:
        stats.add(peer_bytes=sum(len(b) for b in found.values()))
    return found


def blocks_in_place(
    fd: int, info: ShardInfo, blocks: Sequence[int], block_size: int, *, stats: BlockStats
) -> list[int]:
    """Those of ``blocks`` that the full-size file ``fd`` of the shard holds verified: each
    block's bytes checked against its digest where they lie, without copying them.

    The node cache's download file of a shard is shared: the process filling it and the
    node's other readers of the shard (who open the same file) write verified blocks into
    it. What one of them wrote is used by the others in place, mapped and checked (a
    block half written, or a hole, fails its digest: not there yet), never copied into a
    file of their own. Counted as ``peer_bytes``."""
    size = info.raw_data.bytes
    with_data = np.asarray(_blocks_with_data(fd, list(blocks), block_size, size), np.int64)
    found: list[int] = []
    for a, b in coalesce(with_data, len(with_data) or 1):
        start, end = a * block_size, min((b + 1) * block_size, size)
        try:  # block boundaries are page-aligned; the pages are faulted in at once
            mapped = mmap.mmap(
                fd, end - start, mmap.MAP_SHARED | _MAP_POPULATE, mmap.PROT_READ, offset=start
            )
        except (OSError, ValueError):
            continue  # the file is shorter than the shard (never for a partial's own file)
        with mapped, memoryview(mapped) as view:
            found += _verified(info, start, view, range(a, b + 1), block_size)
    if found:
        tail = size - (found[-1] * block_size)
        stats.add(peer_bytes=(len(found) - 1) * block_size + min(block_size, tail))
    return found


_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _verified(
    info: ShardInfo, start: int, view: memoryview, blocks: range, block_size: int
) -> list[int]:
    """Those of consecutive ``blocks`` whose bytes in ``view`` (the file's bytes from
    offset ``start``) match their digests. A block the view cuts short (the file ends
    before it), a hole or a half-written one is not there yet."""
    from shardstream.mds import verify_range  # with block digests (mds >= blocks)

    size = info.raw_data.bytes
    found: list[int] = []
    for block in blocks:
        at = block * block_size - start
        with view[at : at + block_size] as piece:  # released at once: a mapping closes after
            if len(piece) != min(block_size, size - block * block_size):
                break
            try:
                verify_range(info, start + at, piece)
            except CorruptShardError:
                continue
        found.append(block)
    return found


def _blocks_with_data(fd: int, blocks: list[int], block_size: int, size: int) -> list[int]:
    """Those of ``blocks`` whose bytes in file ``fd`` are not all a hole (``SEEK_DATA``).

    A peer's download file is sparse: the blocks nobody wrote yet are holes, and reading
    them would copy megabytes of zeros only to fail their digests. Asking the file system
    where its data lies costs one ``lseek`` per block instead."""
    with_data: list[int] = []
    for block in blocks:
        start = block * block_size
        end = min(start + block_size, size)
        try:
            data_at = os.lseek(fd, start, os.SEEK_DATA)
        except OSError:  # ENXIO: no data from here to the end of the file
            break
        if data_at < end:
            with_data.append(block)
    return with_data


def offer_to_peers(peers: Sequence[Path], data: bytes | bytearray, start: int) -> None:
    """Write verified bytes this process fetched into the node's in-flight download files
    of the same shard, so that their fills find them there instead of fetching them again
    (identical bytes at the same offsets: harmless wherever the file is by now). A
    published cache file is never written: its verified marker covers it."""
    for path in peers:
        if CacheLayout.is_published(path):
            continue
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue  # published or abandoned meanwhile
        try:
            pwrite_all(fd, data, start)
        except OSError:
            pass
        finally:
            os.close(fd)
