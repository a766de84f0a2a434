"""Cross-shard mixing (DESIGN §3.4): every batch draws from all shards of its window, and
the plan is at least as mixed as MosaicML's py1e at the same cache budget."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from shardstream.plan import EpochPlan, PlanConfig, SourceSpec

PER_SHARD = 2048
SHARDS = 96
BATCH = 256


def distinct_per_batch(order: NDArray[np.int64]) -> float:
    rows = np.sort((order // PER_SHARD).reshape(-1, BATCH), axis=1)
    return float(((np.diff(rows, axis=1) != 0).sum(axis=1) + 1).mean())


def spearman(order: NDArray[np.int64]) -> float:
    n = order.size
    d = order.astype(np.float64) - np.arange(n)
    return 1.0 - 6.0 * float(d @ d) / (n * (n * n - 1.0))


def ours(budget: int, seed: int = 3) -> NDArray[np.int64]:
    cfg = PlanConfig(seed=seed, global_batch_size=BATCH, window=budget * PER_SHARD)
    plan = EpochPlan([SourceSpec(shard_sizes=np.full(SHARDS, PER_SHARD))], cfg, epoch=0)
    return plan.global_batches(0, plan.num_batches)


def test_batches_reach_the_window_bound() -> None:
    for budget in (2, 4, 8, 16):
        expected = budget * (1 - (1 - 1 / budget) ** BATCH)  # uniform draws from the window
        assert distinct_per_batch(ours(budget)) >= 0.97 * expected
        assert abs(spearman(ours(budget))) < 0.2


def test_epochs_and_seeds_mix_differently() -> None:
    a, b = ours(8, seed=1), ours(8, seed=2)
    assert not np.array_equal(a, b)
    # Batches of one epoch share few shard pairs with the other's: windows are re-drawn.
    first_a = set(np.unique(a[:BATCH] // PER_SHARD).tolist())
    first_b = set(np.unique(b[:BATCH] // PER_SHARD).tolist())
    assert first_a != first_b


def max_open(order: NDArray[np.int64]) -> int:
    """Most shards between their first and last read at any moment (cache for no refetch)."""
    shards = order // PER_SHARD
    pos = np.arange(order.size)
    first = np.full(SHARDS, order.size, dtype=np.int64)
    last = np.full(SHARDS, -1, dtype=np.int64)
    np.minimum.at(first, shards, pos)
    np.maximum.at(last, shards, pos)
    delta = np.zeros(order.size + 1, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    return int(np.cumsum(delta).max())


def test_at_least_as_mixed_as_py1e_at_equal_budget() -> None:
    from streaming.base.shuffle import get_shuffle

    sizes = np.full(SHARDS, PER_SHARD, dtype=np.int64)
    for budget in (4, 16):
        peer = np.asarray(get_shuffle("py1e", sizes, 1, 3, 0, budget * PER_SHARD))
        mine = ours(budget)
        # Same nominal budget: we keep no more shards open, and mix within a few percent
        # (py1e's jittered blocks overrun the budget by 10-25%, which buys it a little).
        assert max_open(mine) <= budget < max_open(peer)
        assert distinct_per_batch(mine) >= 0.95 * distinct_per_batch(peer)
        # Same real cache (as many open shards as py1e used): at least as mixed.
        assert distinct_per_batch(ours(max_open(peer))) >= distinct_per_batch(peer)
        # Neither leaves a trace of storage order beyond the shard permutation's noise.
        assert abs(spearman(mine)) < 3 / np.sqrt(SHARDS)
