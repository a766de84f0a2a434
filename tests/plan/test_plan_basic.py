"""Basic contract checks of the epoch plan: interface, exactly-once, errors."""

from __future__ import annotations

import numpy as np
import pytest

from shardstream.errors import PlanError
from shardstream.plan import EpochPlan, PlanConfig, SourceSpec


def test_exports() -> None:
    import shardstream.plan as plan

    # Sorted as ruff's RUF022 keeps it: constants, then classes, then functions.
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert plan.__all__ == sorted(plan.__all__, key=kind)
    assert {"EpochPlan", "MixtureSchedule", "PlanConfig", "SourceSpec"} <= set(plan.__all__)


def test_small_plan_is_exactly_once_for_every_world_size() -> None:
    cfg = PlanConfig(seed=3, global_batch_size=8, num_partitions=4)
    plan = EpochPlan([SourceSpec(shard_sizes=np.array([10, 10, 12]))], cfg, epoch=1)
    assert plan.num_batches == 4
    order = plan.global_batches(0, plan.num_batches)
    assert sorted(order.tolist()) == list(range(32))
    for world in (1, 2, 4, 8):
        got = np.concatenate(
            [plan.rank_batch(b, r, world) for b in range(plan.num_batches) for r in range(world)]
        )
        assert got.tolist() == order.tolist()


def test_locate_splits_ids() -> None:
    cfg = PlanConfig(global_batch_size=2)
    plan = EpochPlan([SourceSpec(shard_sizes=np.array([3, 0, 5]))], cfg)
    shard, idx = plan.locate(np.array([0, 2, 3, 7]))
    assert shard.tolist() == [0, 0, 2, 2]
    assert idx.tolist() == [0, 2, 0, 4]
    with pytest.raises(PlanError, match="sample ids"):
        plan.locate([8])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"global_batch_size": 10, "num_partitions": 4}, "not divisible by num_partitions"),
        ({"global_batch_size": 0}, "global_batch_size must be >= 1"),
        ({"global_batch_size": 8, "tail": "keep"}, "tail must be"),
        ({"global_batch_size": 8, "window": 0}, "window must be >= 1"),
    ],
)
def test_config_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        PlanConfig(**kwargs)  # type: ignore[arg-type]


def test_any_world_size_dividing_the_batch_reads_the_plan() -> None:
    """World sizes need not divide or be divided by num_partitions, only the batch."""
    cfg = PlanConfig(global_batch_size=24, num_partitions=4)
    plan = EpochPlan([SourceSpec(shard_sizes=np.array([50, 50]))], cfg)
    whole = plan.global_batches(0, 1)
    for world in (3, 12, 24):
        got = np.concatenate([plan.rank_batch(0, r, world) for r in range(world)])
        np.testing.assert_array_equal(got, whole)
    with pytest.raises(PlanError, match="not divisible by world_size=5"):
        plan.rank_batch(0, 0, 5)


def test_batch_larger_than_data() -> None:
    cfg = PlanConfig(global_batch_size=64)
    with pytest.raises(PlanError, match="fewer than one global batch"):
        EpochPlan([SourceSpec(shard_sizes=np.array([10]))], cfg)
    padded = EpochPlan(
        [SourceSpec(shard_sizes=np.array([10]))], PlanConfig(global_batch_size=64, tail="pad")
    )
    assert padded.num_batches == 1
    assert sorted(set(padded.rank_batch(0, 0, 1).tolist())) == list(range(10))


def test_rank_batch_matches_rank_batches_under_interleaved_calls() -> None:
    cfg = PlanConfig(seed=8, global_batch_size=16, num_partitions=4, window=50)
    plan = EpochPlan([SourceSpec(shard_sizes=np.arange(1, 60))], cfg, epoch=2)
    rng = np.random.default_rng(1)
    expected = {
        (r, w): plan.rank_batches(np.arange(plan.num_batches), r, w)
        for w in (1, 2, 4, 8, 16)
        for r in range(w)
    }
    for _ in range(400):
        w = int(rng.choice([1, 2, 4, 8, 16]))
        r, b = int(rng.integers(w)), int(rng.integers(plan.num_batches))
        got = plan.rank_batch(b, r, w)
        got[:] = -1  # callers own the returned array: it must not alias the plan's cache
        np.testing.assert_array_equal(plan.rank_batch(b, r, w), expected[(r, w)][b])
