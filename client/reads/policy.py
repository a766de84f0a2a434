"""The read policy: how this process reads each shard, and the cold-start rules. No I/O.

Every decision the read path makes about *how* to read lives here, as plain functions and
one small counter over plain values, so each rule is tested alone
(``tests/client/reads/test_policy.py``):

- **Whole or ranged** (:func:`reads_ranged`): zstd shards, stores whose objects are local
  files (with a cache), one-block shards and (by default) shards without block digests
  are fetched whole; the rest is read by block range.
- **Light shards** (:func:`light_shards`): a rank reads only a few samples of the shards at
  its partitions' edges. Filling such a shard whole costs a whole shard for a few samples,
  so it is read by piece (its samples touch under :data:`FILL_MIN_SHARE` of its 64 KiB
  pieces) or else by block (under that share of its blocks), and never filled.
- **A shard's mode** (:func:`mode_of`): :class:`ReadMode` from the two above.
- **Cold start.** A process's first ``piece_read_batches`` batches read their samples by
  piece, ahead of every block (:class:`PieceBatches`); background fills start only once
  the first chunk is built (:func:`fills_now`), so they do not share the link with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from shardstream.client.reads.ranges import block_size_of
from shardstream.errors import ConfigError
from shardstream.mds import ShardInfo

__all__ = [
    "FILL_MIN_SHARE",
    "LightShards",
    "PieceBatches",
    "ReadMode",
    "ShardFacts",
    "fills_now",
    "light_shards",
    "mode_of",
    "reads_ranged",
    "touched",
]

FILL_MIN_SHARE = 0.2
"""The cache fills a ranged shard whole unless this rank's samples of it lie in fewer than
this share of its blocks (or pieces): it then reads just those (a partition boundary inside
a shard, whose other side another node reads and caches)."""


class ReadMode(Enum):
    """How one shard is read in this process."""

    WHOLE = "whole"
    """Fetched whole: through the node cache's download, or in one read into memory."""
    RANGED = "ranged"
    """By block range as batches need it; with the cache, also filled whole behind them."""
    SPARSE = "sparse"
    """By block range, never filled (this rank reads a few of its blocks)."""
    BY_PIECE = "by_piece"
    """By 64 KiB piece in every batch, never by block, never filled."""


@dataclass(frozen=True)
class ShardFacts:
    """What the policy reads of a shard's index entry."""

    bytes: int
    samples: int
    block_size: int
    """The block size reads use: the digest blocks', else the default."""
    block_digests: bool
    compressed: bool
    pieces: int
    """Pieces in its piece table (0: none)."""
    name: str = ""

    @staticmethod
    def of(info: ShardInfo) -> ShardFacts:
        """The facts of an index entry."""
        spec = info.piece_spec
        return ShardFacts(
            bytes=info.raw_data.bytes,
            samples=info.samples,
            block_size=block_size_of(info),
            block_digests=getattr(info, "block_digests", None) is not None,
            compressed=info.compression is not None,
            pieces=spec.pieces if spec is not None else 0,
            name=info.raw_data.basename,
        )


Unverified = Literal["whole_shard", "verify_on_completion", "refuse"]


def reads_ranged(
    shard: ShardFacts,
    *,
    ranged_reads: bool,
    cached: bool,
    local_store: bool,
    unverified_blocks: Unverified | str,
    source: str = "",
) -> bool:
    """Whether ``shard`` is read by block range (else fetched whole).

    ``cached``: the node cache is on (not ``memory_only``); ``local_store``: the store's
    objects are local files. :class:`ConfigError` for a shard without block digests under
    ``unverified_blocks="refuse"``.
    """
    if shard.compressed or not ranged_reads:
        return False  # a zstd frame cannot be read in pieces
    if cached and local_store:
        return False  # a local copy is one sequential read anyway
    if shard.block_digests:
        # One block: by range it costs the header, pieces and then this very block
        # (~1.8x its bytes in 4-5 round trips); whole, one GET, once per node.
        return shard.bytes > shard.block_size
    if unverified_blocks == "refuse":
        raise ConfigError(
            f"shard {shard.name} of {source!r} has no per-block digests, so its blocks cannot "
            "be verified; rebuild the dataset with block digests or set "
            "ReadOptions.unverified_blocks='whole_shard'"
        )
    return unverified_blocks == "verify_on_completion" and cached


def touched(units: int, samples: float) -> float:
    """The expected share of ``units`` equal parts of a shard that ``samples`` samples at
    random places touch: ``1 - (1 - 1/units)^samples``."""
    return float(1 - (1 - 1 / units) ** samples)


@dataclass(frozen=True)
class LightShards:
    """Shards a rank reads so little of that filling them whole would waste the link."""

    sparse: frozenset[int] = frozenset()
    """Read by block only."""
    by_piece: frozenset[int] = frozenset()
    """Read by piece only (they have a piece table)."""

    @property
    def unfilled(self) -> frozenset[int]:
        """Every light shard: the cache never fills them whole."""
        return self.sparse | self.by_piece


def light_shards(
    shards: Sequence[int], shares: Sequence[float], facts: Callable[[int], ShardFacts]
) -> LightShards:
    """The light shards among ``shards``, of which this rank reads ``shares`` of the
    samples (``EpochPlan.rank_shard_shares``).

    A rank's partitions hold whole shards but at their edges (the epoch's tail, uneven
    shards), where it reads ``k`` samples of a shard another rank reads nearly all of.
    Those ``k`` samples lie anywhere in the shard, so they touch about
    ``n (1 - (1 - 1/n)^k)`` of its ``n`` blocks (or pieces). A shard whose ``k`` samples
    touch under :data:`FILL_MIN_SHARE` of its pieces is read by piece: ~48 samples of a
    64 MB shard cost 3 MB, not most of its blocks. Else one whose samples touch under
    that share of its blocks is read by block.
    """
    sparse, by_piece = set(), set()
    for shard, part in zip(shards, shares, strict=True):
        if part >= FILL_MIN_SHARE:
            continue
        info = facts(shard)
        samples = part * info.samples
        if info.pieces and touched(info.pieces, samples) < FILL_MIN_SHARE:
            by_piece.add(shard)
            continue
        blocks = max(1, -(-info.bytes // info.block_size))
        if touched(blocks, samples) < FILL_MIN_SHARE:
            sparse.add(shard)
    return LightShards(frozenset(sparse), frozenset(by_piece))


def mode_of(shard: int, *, ranged: bool, light: LightShards, cached: bool) -> ReadMode:
    """How ``shard`` is read. Without the cache nothing is filled, so a sparse shard reads
    as any ranged one; reading by piece applies in both modes."""
    if not ranged:
        return ReadMode.WHOLE
    if shard in light.by_piece:
        return ReadMode.BY_PIECE
    if cached and shard in light.sparse:
        return ReadMode.SPARSE
    return ReadMode.RANGED


def fills_now(first_chunk_built: bool) -> bool:
    """Whether background fills may start: not before a pass's first chunk is built (a cold
    first batch reads its own blocks, and fills beside it would share the link; they start
    with the next chunk, adopting the blocks it read)."""
    return first_chunk_built


class PieceBatches:
    """The cold-start rule for piece reads: a process's first ``budget`` batches
    (``ReadOptions.piece_read_batches``) read their samples by piece.

    Whole chunks only: once a chunk holds more batches than are left, no later chunk (they
    only grow) reads by piece. The stream shows each chunk twice, first as look-ahead
    (``want``), then to build it (``need``): the first showing counts it, the second finds
    it counted.
    """

    def __init__(self, budget: int) -> None:
        self._left = budget
        self._counted: set[int] = set()

    def by_piece(self, batches: Sequence[int] | None, *, first_showing: bool) -> bool:
        """Whether the chunk of ``batches`` reads by piece."""
        if not batches:
            return False
        chunk = int(min(batches))
        if chunk in self._counted:
            if not first_showing:
                self._counted.discard(chunk)
            return True
        if self._left < len(batches):
            self._left = 0  # later chunks are larger still
            return False
        self._left -= len(batches)
        if first_showing:
            self._counted.add(chunk)
        return True
