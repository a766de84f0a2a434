"""Shards held in memory only: the cacheless mode, and early reads in cache mode.

:class:`MemoryShards` keeps one process's private :class:`PartialShard` objects, each
backed by an anonymous memory file (``memfd``) of the shard's full size, of which only the
fetched blocks occupy memory. A budget bounds them all together: before new blocks are
fetched, the least recently used blocks that no batch in the look-ahead wants are dropped
(the kernel frees their pages), headers excepted.

Bytes are fetched about once per epoch per *node*: the node's reading processes (ranks,
DataLoader or loader workers) find each other's memory files (:mod:`.peer_files`) and
copy blocks another one already fetched, checked against their digests, instead of
fetching them; only blocks two processes want before either has them are fetched twice.
A block is fetched twice by one process only if the budget forced it out before its last
use (``BlockStats.bytes_evicted`` counts what was dropped). The stream prevents that: it
checks the budget against the window's need before the first read
(:mod:`~shardstream.client.reads.memory_need`), tells this class the last batch of each shard
(whose blocks are all dropped once it is past) and stamps blocks with the batch numbers
that use them, so blocks wanted by batches not yet built are never evicted.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt

from shardstream.client.reads.block_sources import NodeSharing
from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.partial import PartialShard
from shardstream.client.reads.peer_files import MemoryPeers
from shardstream.client.reads.queue import RangeQueue
from shardstream.client.reads.ranges import block_size_of
from shardstream.client.reads.refetch import refetched
from shardstream.errors import ConfigError, HashMismatchError
from shardstream.hashing import choose_verify_algo, hash_bytes
from shardstream.mds import ShardInfo
from shardstream.storage import ObjectStore

__all__ = ["MemoryShards", "check_budget"]

log = logging.getLogger(__name__)


class MemoryShards:
    """Private, memory-backed partial shards of one process, within ``budget_bytes``."""

    def __init__(
        self,
        *,
        queue: RangeQueue,
        budget_bytes: int,
        range_bytes: int,
        stats: BlockStats,
        peers: MemoryPeers | None = None,
    ) -> None:
        self._queue = queue
        self._peers = peers
        self._links: dict[int, tuple[str, Path | None]] = {}
        self._budget = budget_bytes
        self._range_bytes = range_bytes
        self._stats = stats
        self._lock = threading.Lock()
        self._shards: dict[int, PartialShard] = {}
        self._uses: dict[PartialShard, npt.NDArray[np.int64]] = {}
        """The last batch (or tick) that uses each block of a held partial."""
        self._tick = 0
        self._last: dict[int, int] = {}
        """The last batch that reads each shard (from the plan), once the stream told."""
        self._warned = False

    def get(self, shard: int) -> PartialShard | None:
        """The shard's partial if this process holds one."""
        return self._shards.get(shard)

    def open(
        self, shard: int, info: ShardInfo, key: str, store: ObjectStore, *, node_key: str
    ) -> PartialShard:
        """The shard's partial, created (empty) on first use. ``node_key`` names the shard
        on the node (its cache key: the index identity and the shard), for peers."""
        with self._lock:
            partial = self._shards.get(shard)
            if partial is not None:
                return partial
            fd = os.memfd_create(f"shardstream-{shard}", os.MFD_CLOEXEC)
            block = block_size_of(info)
            sharing = NodeSharing()
            if self._peers is not None:  # the node's other processes read what we fetched
                self._links[shard] = (node_key, self._peers.register(node_key, fd))
                peers = functools.partial(self._peers.others, node_key)
                sharing = NodeSharing(peers=peers, claims=self._peers.claims(node_key))
            partial = PartialShard(
                info=info,
                key=key,
                store=store,
                fd=fd,
                path=Path(f"/proc/self/fd/{fd}"),
                queue=self._queue,
                block_size=block,
                range_blocks=max(1, self._range_bytes // block),
                stats=self._stats,
                sharing=sharing,
            )
            self._shards[shard] = partial
            self._uses[partial] = np.zeros(partial.num_blocks, dtype=np.int64)
            return partial

    def join(
        self,
        shard: int,
        info: ShardInfo,
        key: str,
        store: ObjectStore,
        *,
        node_key: str,
        download: Path,
    ) -> PartialShard | None:
        """Cache mode: the shard's partial over ``download``, the node cache's download
        file of it that another process of the node is filling, or ``None`` if that file is
        gone or not yet full size.

        The blocks in it are used where they lie once their digests match
        (:func:`~shardstream.client.reads.block_sources.blocks_in_place`), blocks fetched here are
        written into it for the filler, and the node's claims keep a block from being
        fetched by both. Nothing of it is ever freed here (it is the node's file); once
        the filler publishes it, this open file is the published shard."""
        with self._lock:
            held = self._shards.get(shard)
            if held is not None:
                return held if held.sharing.node_shared else None
            try:
                fd = os.open(download, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return None  # published or abandoned meanwhile
            st = os.fstat(fd)
            if st.st_size != info.raw_data.bytes or st.st_uid != os.getuid():
                os.close(fd)  # being created (not yet sized), or not this user's
                return None
            block = block_size_of(info)
            claims = self._peers.claims(node_key) if self._peers is not None else None
            partial = PartialShard(
                info=info,
                key=key,
                store=store,
                fd=fd,
                path=Path(f"/proc/self/fd/{fd}"),  # the same file once renamed into place
                queue=self._queue,
                block_size=block,
                range_blocks=max(1, self._range_bytes // block),
                stats=self._stats,
                sharing=NodeSharing(claims=claims, node_shared=True),
            )
            self._shards[shard] = partial
            self._uses[partial] = np.zeros(partial.num_blocks, dtype=np.int64)
            return partial

    def load_whole(self, partial: PartialShard, compression: str | None) -> None:
        """Fill ``partial`` from one whole-object read, verified against the shard's hash
        (shards without block digests, and zstd shards, which ranges cannot split)."""
        stored = partial.info.stored
        algo = choose_verify_algo(stored.file_hashes)

        def download() -> bytes:
            data = partial.store.read_bytes(partial.key)
            self._stats.add(requests=1, bytes_fetched=len(data))
            if algo is not None and hash_bytes(algo, data) != stored.file_hashes[algo]:
                raise HashMismatchError(
                    f"{partial.key}: {algo} differs from the index; the stored shard is corrupt"
                )
            return data

        packed = refetched(partial.key, download)  # a flipped byte on the way: again
        partial.write_whole(packed, compression)

    def tick(self) -> int:
        """Advance the use clock (once per chunk of batches); returns the new time."""
        self._tick += 1
        return self._tick

    def schedule(self, last: dict[int, int]) -> None:
        """The last batch that reads each shard (an epoch's pass starts): past it, or
        absent, the shard's blocks all go first. The use clock restarts, as batch numbers
        do in a new epoch."""
        with self._lock:
            self._last = dict(last)
            self._tick = 0
            for uses in self._uses.values():
                uses[:] = 0

    def now(self, batch: int) -> None:
        """Set the use clock to ``batch`` (the first batch of the chunk being built):
        blocks stamped with a later batch are wanted ahead and stay."""
        self._tick = max(self._tick, batch)

    def drop_finished(self) -> int:
        """Free every block (header included) of shards whose last batch is past; returns
        the bytes freed."""
        with self._lock:
            done = [s for s, p in self._shards.items() if self._last.get(s, -1) < self._tick]
            partials = [self._shards.pop(s) for s in done]
            for partial in partials:
                self._uses.pop(partial, None)
        freed = 0
        for shard, partial in zip(done, partials, strict=True):
            self._withdraw(shard)
            freed += partial.evict(partial.present_blocks())
            partial.retire()
        return freed

    def _withdraw(self, shard: int) -> None:
        found = self._links.pop(shard, None)
        if found is not None and self._peers is not None:
            self._peers.withdraw(*found)

    def touch(self, partial: PartialShard, blocks: npt.NDArray[np.int64], when: int) -> None:
        """Record that ``blocks`` are used at ``when`` (now, or a look-ahead chunk's time)."""
        uses = self._uses.get(partial)
        if uses is not None:  # else dropped meanwhile: nothing left to keep
            np.maximum.at(uses, blocks, when)

    def make_room(self, incoming: int) -> None:
        """Evict unwanted blocks (least recently used first) so that ``incoming`` more bytes
        fit the budget; when nothing more can go, continue over it and warn once."""
        with self._lock:
            shards = list(self._shards.values())
            uses = dict(self._uses)
        used = sum(p.present_bytes() for p in shards)
        excess = used + incoming - self._budget
        if excess <= 0:
            return
        if self._last:
            excess -= self.drop_finished()
            if excess <= 0:
                return
            with self._lock:
                shards = list(self._shards.values())
                uses = dict(self._uses)
        candidates: list[tuple[int, int, PartialShard]] = []
        for p in shards:
            present, last_use = p.present_blocks(), uses[p]
            if p.header.blocks.size:
                present = np.setdiff1d(present, p.header.blocks, assume_unique=True)
            old = present[last_use[present] < self._tick]
            candidates.extend((int(last_use[b]), int(b), p) for b in old.tolist())
        candidates.sort(key=lambda c: (c[0], c[1]))
        for _, block, p in candidates:
            if excess <= 0:
                break
            excess -= p.evict(np.array([block], dtype=np.int64))
        if excess > 0 and not self._warned:
            self._warned = True
            log.warning(
                "cacheless reads need %d bytes more than ReadOptions.memory_budget_bytes=%d "
                "for the batches in flight; continuing over budget (raise it, or lower the "
                "batch size or the plan window)",
                excess,
                self._budget,
            )

    def drop(self, shard: int) -> None:
        """Forget a shard's partial (its cache entry took over), freeing its memory."""
        with self._lock:
            partial = self._shards.pop(shard, None)
            if partial is not None:
                self._uses.pop(partial, None)
            self._withdraw(shard)
        if partial is not None:
            partial.retire()

    def close(self) -> None:
        """Free every partial."""
        with self._lock:
            shards, self._shards = list(self._shards.values()), {}
            self._uses.clear()
            for shard in list(self._links):
                self._withdraw(shard)
        for partial in shards:
            partial.close()


def check_budget(budget: int, info: ShardInfo) -> None:
    """A whole-shard fallback must fit the memory budget."""
    if info.raw_data.bytes > budget:
        raise ConfigError(
            f"shard {info.raw_data.basename} ({info.raw_data.bytes} bytes) must be read whole "
            f"but ReadOptions.memory_budget_bytes is {budget}; raise the budget"
        )
