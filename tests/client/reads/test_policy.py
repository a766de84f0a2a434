"""The read policy, rule by rule, without I/O (client/reads/policy.py)."""

from __future__ import annotations

from typing import Any

import pytest

from shardstream.client.reads.policy import (
    FILL_MIN_SHARE,
    LightShards,
    PieceBatches,
    ReadMode,
    ShardFacts,
    fills_now,
    light_shards,
    mode_of,
    reads_ranged,
    touched,
)
from shardstream.errors import ConfigError

MB = 1 << 20


def facts(**kw: Any) -> ShardFacts:
    """A 64 MB shard of 4 MiB digest blocks and 1,024 pieces, 2,000 samples."""
    base: dict[str, Any] = dict(
        bytes=64 * MB,
        samples=2000,
        block_size=4 * MB,
        block_digests=True,
        compressed=False,
        pieces=1024,
        name="shard.00000.mds",
    )
    return ShardFacts(**{**base, **kw})


def ranged(shard: ShardFacts, **kw: Any) -> bool:
    opts: dict[str, Any] = dict(
        ranged_reads=True, cached=True, local_store=False, unverified_blocks="whole_shard"
    )
    return reads_ranged(shard, **{**opts, **kw}, source="s3://b/ds")


# -- whole or ranged ----------------------------------------------------------------------


def test_a_remote_shard_with_block_digests_is_read_by_range() -> None:
    assert ranged(facts())
    assert ranged(facts(), cached=False)


def test_zstd_shards_and_ranged_reads_off_are_read_whole() -> None:
    assert not ranged(facts(compressed=True))
    assert not ranged(facts(), ranged_reads=False)


def test_a_local_store_is_read_whole_with_the_cache_only() -> None:
    assert not ranged(facts(), local_store=True)
    assert ranged(facts(), local_store=True, cached=False)  # memory: no sequential copy


def test_a_shard_of_one_block_is_read_whole() -> None:
    assert not ranged(facts(bytes=4 * MB))
    assert not ranged(facts(bytes=128 << 10))
    assert ranged(facts(bytes=4 * MB + 1))


def test_shards_without_block_digests_follow_unverified_blocks() -> None:
    plain = facts(block_digests=False, block_size=MB, pieces=0)
    assert not ranged(plain)  # whole_shard, the default
    assert ranged(plain, unverified_blocks="verify_on_completion")
    assert not ranged(plain, unverified_blocks="verify_on_completion", cached=False)
    with pytest.raises(ConfigError, match=r"shard\.00000\.mds of 's3://b/ds' has no per-block"):
        ranged(plain, unverified_blocks="refuse")


# -- light shards (fill shares) -----------------------------------------------------------


def test_touched_is_the_expected_share_of_parts_hit() -> None:
    assert touched(1, 1) == 1.0
    assert touched(16, 0) == 0.0
    assert touched(16, 1) == pytest.approx(1 / 16)
    assert touched(1024, 48) == pytest.approx(1 - (1023 / 1024) ** 48)


def test_a_shard_the_rank_reads_most_of_is_filled() -> None:
    light = light_shards([0, 1], [1.0, FILL_MIN_SHARE], lambda s: facts())
    assert light == LightShards()


def test_a_few_samples_of_a_shard_with_pieces_are_read_by_piece() -> None:
    # 48 samples of 2,000 in 1,024 pieces touch ~4.6 % of them; of its 16 blocks, 95 %.
    share = 48 / 2000
    light = light_shards([3], [share], lambda s: facts())
    assert light == LightShards(by_piece=frozenset({3}))
    assert light.unfilled == {3}


def test_without_pieces_a_few_samples_are_read_by_block_when_they_touch_few() -> None:
    # 2 samples of 2,000 touch ~12 % of 16 blocks: by block, not filled.
    light = light_shards([5], [2 / 2000], lambda s: facts(pieces=0))
    assert light == LightShards(sparse=frozenset({5}))
    # 48 samples touch nearly every block: filling it whole costs no more.
    assert light_shards([5], [48 / 2000], lambda s: facts(pieces=0)) == LightShards()


def test_pieces_are_tried_before_blocks() -> None:
    # Too many samples for pieces (1,000 of 2,000 pieces' worth) and for blocks: filled.
    assert light_shards([1], [0.19], lambda s: facts(pieces=8)) == LightShards()


# -- a shard's mode -----------------------------------------------------------------------


def test_mode_of_each_shard() -> None:
    light = LightShards(sparse=frozenset({1}), by_piece=frozenset({2}))
    assert mode_of(0, ranged=False, light=light, cached=True) is ReadMode.WHOLE
    assert mode_of(2, ranged=False, light=light, cached=True) is ReadMode.WHOLE
    assert mode_of(0, ranged=True, light=light, cached=True) is ReadMode.RANGED
    assert mode_of(1, ranged=True, light=light, cached=True) is ReadMode.SPARSE
    assert mode_of(2, ranged=True, light=light, cached=True) is ReadMode.BY_PIECE
    # Cacheless: nothing is filled, so sparse is plain ranged; pieces still apply.
    assert mode_of(1, ranged=True, light=light, cached=False) is ReadMode.RANGED
    assert mode_of(2, ranged=True, light=light, cached=False) is ReadMode.BY_PIECE


# -- cold start ---------------------------------------------------------------------------


def test_fills_start_once_the_first_chunk_is_built() -> None:
    assert not fills_now(first_chunk_built=False)
    assert fills_now(first_chunk_built=True)


def test_the_first_batch_reads_by_piece_once_seen_twice() -> None:
    pieces = PieceBatches(1)
    assert pieces.by_piece([0], first_showing=True)  # want: counted
    assert pieces.by_piece([0], first_showing=False)  # need: found counted
    assert not pieces.by_piece([1, 2], first_showing=True)
    assert not pieces.by_piece([1, 2], first_showing=False)


def test_piece_batches_count_whole_chunks_and_stop_for_good() -> None:
    pieces = PieceBatches(3)
    assert pieces.by_piece([0], first_showing=True)
    assert pieces.by_piece([1, 2], first_showing=True)
    assert not pieces.by_piece([3, 4], first_showing=True)  # none left
    assert pieces.by_piece([0], first_showing=False)
    assert pieces.by_piece([1, 2], first_showing=False)
    big = PieceBatches(3)
    assert big.by_piece([0], first_showing=True)
    assert not big.by_piece([1, 2, 3, 4], first_showing=True)  # larger than what is left
    assert not big.by_piece([5], first_showing=True)  # later chunks are not tried again


def test_a_need_without_its_want_counts_too_and_no_batches_never_read_by_piece() -> None:
    pieces = PieceBatches(1)
    assert not pieces.by_piece(None, first_showing=True)
    assert not pieces.by_piece([], first_showing=False)
    assert pieces.by_piece([7], first_showing=False)  # counted here, not remembered
    assert not pieces.by_piece([8], first_showing=False)
    assert not PieceBatches(0).by_piece([0], first_showing=True)
