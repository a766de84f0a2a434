"""Mixtures of several versions: proportions, repeats and absolute counts are exact, and a
mixed plan keeps exactly-once, elastic order and across-epoch coverage."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardstream.errors import PlanError
from shardstream.plan import PLAN_ALGORITHM, EpochPlan, PlanConfig, SourceSpec, plan_fingerprint

SETTINGS = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def per_source_counts(plan: EpochPlan, ids: NDArray[np.int64]) -> list[Counter[int]]:
    shard, _ = plan.locate(ids)
    src = np.searchsorted(plan.source_shard_offsets, shard, side="right") - 1
    return [Counter(ids[src == s].tolist()) for s in range(len(plan.sources))]


@st.composite
def sources(draw: st.DrawFn) -> list[SourceSpec]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        sizes = np.array(draw(st.lists(st.integers(1, 40), min_size=1, max_size=12)))
        mode = draw(st.sampled_from(["plain", "repeat", "count", "weight"]))
        kw: dict[str, float | int] = {}
        if mode == "repeat":
            kw["repeat"] = draw(st.floats(0.05, 3.5))
        elif mode == "count":
            kw["count"] = draw(st.integers(1, 3 * int(sizes.sum())))
        elif mode == "weight":
            kw["weight"] = draw(st.floats(0.1, 5.0))
        out.append(SourceSpec(shard_sizes=sizes, name=f"src{i}@v1", **kw))  # type: ignore[arg-type]
    return out


@given(sources(), st.integers(0, 2**32), st.integers(0, 4), st.booleans())
@SETTINGS
def test_mixture_totals_and_per_sample_counts_are_exact(
    srcs: list[SourceSpec], seed: int, epoch: int, shuffle: bool
) -> None:
    # Batch size 1 makes the epoch exactly the mixture (no tail to drop or pad).
    cfg = PlanConfig(seed=seed, global_batch_size=1, shuffle=shuffle)
    if sum(
        s.weight is None and s.repeat is not None and round(s.repeat * s.num_samples) == 0
        for s in srcs
    ) == len(srcs):
        return
    plan = EpochPlan(srcs, cfg, epoch)
    ids = plan.global_batches(0, plan.num_batches)
    counts = per_source_counts(plan, ids)
    weighted = [s for s in srcs if s.weight is not None]
    share = sum(s.num_samples for s in weighted)
    total_w = sum(s.weight or 0 for s in weighted)
    for src, got, total in zip(srcs, counts, plan.source_totals, strict=True):
        assert sum(got.values()) == total
        n = src.num_samples
        if src.count is not None:
            assert total == src.count
        elif src.repeat is not None:
            assert total == round(src.repeat * n)
        elif src.weight is not None:
            assert abs(total - share * src.weight / total_w) < 1
        else:
            assert total == n
        # Every sample of the source is taken floor or ceil of total / n times.
        lo, hi = total // n, -(-total // n)
        assert all(lo <= c <= hi for c in got.values())
        assert len(got) == (n if lo >= 1 else total)
        # ...and every shard within one of its proportional share.
        base = plan.shard_starts[plan.source_shard_offsets[srcs.index(src)]]
        per_shard = (
            np.bincount(
                np.searchsorted(
                    plan.shard_starts, np.array(list(got.elements()), dtype=np.int64), side="right"
                )
                - 1
                - plan.source_shard_offsets[srcs.index(src)],
                minlength=src.shard_sizes.size,
            )
            if total
            else np.zeros(src.shard_sizes.size)
        )
        assert base >= 0
        assert np.all(np.abs(per_shard - total * src.shard_sizes / n) < 1 + 1e-9)


@given(sources(), st.sampled_from([(1, 2), (2, 4), (4, 4), (4, 8)]), st.data())
@SETTINGS
def test_mixed_plan_is_exactly_once_and_elastic(
    srcs: list[SourceSpec], pb: tuple[int, int], data: st.DataObject
) -> None:
    parts, batch = pb
    cfg = PlanConfig(
        seed=data.draw(st.integers(0, 99)),
        global_batch_size=batch,
        num_partitions=parts,
        tail="pad",
        window=data.draw(st.integers(1, 50)),
    )
    try:
        plan = EpochPlan(srcs, cfg, epoch=data.draw(st.integers(0, 3)))
    except PlanError:
        return  # every source rounded to zero samples
    full = plan.global_batches(0, plan.num_batches)
    expected: Counter[int] = Counter()
    for c in per_source_counts(
        EpochPlan(srcs, PlanConfig(seed=cfg.seed, global_batch_size=1), plan.epoch),
        EpochPlan(srcs, PlanConfig(seed=cfg.seed, global_batch_size=1), plan.epoch).global_batches(
            0, plan.num_samples
        ),
    ):
        expected.update(c)
    got = Counter(full.tolist())
    # The padded epoch holds the mixture exactly, plus (num_positions - M) wrapped repeats.
    assert all(got[i] >= c for i, c in expected.items()) and set(got) == set(expected)
    assert sum(got.values()) - sum(expected.values()) == plan.num_positions - plan.num_samples
    assert plan.num_positions - plan.num_samples < batch
    for world in (1, 2, 4, 8):
        if batch % world or (parts % world and world % parts):
            continue
        per_rank = [plan.rank_batches(np.arange(plan.num_batches), r, world) for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(per_rank, axis=1).ravel(), full)


def test_fractional_repeat_covers_the_source_over_epochs() -> None:
    rng = np.random.default_rng(5)
    sizes = rng.integers(200, 800, size=40)
    for r in (0.25, 0.3, 0.5):
        seen: set[int] = set()
        for epoch in range(math.ceil(1 / r)):
            plan = EpochPlan(
                [SourceSpec(shard_sizes=sizes, repeat=r)], PlanConfig(global_batch_size=8), epoch
            )
            seen |= set(plan.global_batches(0, plan.num_batches).tolist())
        # A fresh random subset each epoch would cover only ~1-(1-r)^(1/r) (63-75%).
        assert len(seen) / sizes.sum() > 0.98


def test_sources_are_interleaved_not_concatenated() -> None:
    a = SourceSpec(shard_sizes=np.full(200, 100), name="a")
    b = SourceSpec(shard_sizes=np.full(100, 100), name="b")
    plan = EpochPlan([a, b], PlanConfig(seed=2, global_batch_size=256, num_partitions=4), 0)
    ids = plan.global_batches(0, plan.num_batches)
    from_b = ids >= a.num_samples
    for part in np.array_split(from_b, 10):
        assert 0.2 < part.mean() < 0.47  # b is 1/3 of the data in every tenth of the epoch


def test_epoch_size_with_weights_and_counts() -> None:
    srcs = [
        SourceSpec(shard_sizes=np.full(10, 50), weight=3.0, name="a"),
        SourceSpec(shard_sizes=np.full(10, 50), weight=1.0, name="b"),
        SourceSpec(shard_sizes=np.full(4, 25), count=250, name="c"),
    ]
    plan = EpochPlan(srcs, PlanConfig(global_batch_size=10, epoch_size=1250), 0)
    assert plan.source_totals == [750, 250, 250]
    counts = per_source_counts(plan, plan.global_batches(0, plan.num_batches))
    assert [sum(c.values()) for c in counts] == [750, 250, 250]
    assert max(counts[0].values()) == 2 and max(counts[2].values()) == 3


@pytest.mark.parametrize(
    ("srcs", "cfg", "match"),
    [
        ([SourceSpec(shard_sizes=np.array([5]), count=3)], {"epoch_size": 10}, "only applies"),
        (
            [
                SourceSpec(shard_sizes=np.array([5]), count=30),
                SourceSpec(shard_sizes=np.array([5]), weight=1),
            ],
            {"epoch_size": 10},
            "smaller than",
        ),
    ],
)
def test_mixture_errors(srcs: list[SourceSpec], cfg: dict[str, int], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        EpochPlan(srcs, PlanConfig(global_batch_size=1, **cfg), 0)  # type: ignore[arg-type]


def test_source_spec_validation() -> None:
    with pytest.raises(PlanError, match="only one of"):
        SourceSpec(shard_sizes=np.array([1]), weight=1.0, repeat=2.0)
    with pytest.raises(PlanError, match=r"'x@v1'.*repeat must be"):
        SourceSpec(shard_sizes=np.array([1]), repeat=-1.0, name="x@v1")
    with pytest.raises(PlanError, match="shard 1 has a negative"):
        SourceSpec(shard_sizes=np.array([1, -2]))
    with pytest.raises(PlanError, match="integers"):
        SourceSpec(shard_sizes=np.array([1.5]))


def test_fingerprint_names_the_data_the_parameters_and_the_algorithm() -> None:
    # The resume state (client/state.py) carries this digest: it must change with the
    # version, every plan parameter and the algorithm, and not with the epoch.
    src = [SourceSpec(shard_sizes=np.full(8, 30), name="d@v1")]
    plan = EpochPlan(src, PlanConfig(seed=4, global_batch_size=16, num_partitions=2), 1)
    assert EpochPlan(src, plan.config, 2).fingerprint == plan.fingerprint
    other_version = EpochPlan([SourceSpec(shard_sizes=np.full(8, 30), name="d@v2")], plan.config, 1)
    other_sizes = EpochPlan([SourceSpec(shard_sizes=np.full(8, 31), name="d@v1")], plan.config, 1)
    other_batch = EpochPlan(src, PlanConfig(seed=4, global_batch_size=32, num_partitions=2), 1)
    prints = {p.fingerprint for p in (plan, other_version, other_sizes, other_batch)}
    assert len(prints) == 4
    assert plan_fingerprint(PLAN_ALGORITHM + 1, plan.config, src) != plan.fingerprint
