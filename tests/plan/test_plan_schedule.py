"""Mixture schedules: per-source weights as a function of the step, planned as one mixture
per segment. Properties: each segment holds exactly its weights' share of each source,
every sample is used once per its repeat budget over the epoch, any world size reads the
same global batches, and a resume across a schedule boundary continues exactly."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardstream.errors import PlanError
from shardstream.plan import (
    DEFAULT_RAMP_STEPS,
    EpochPlan,
    MixtureSchedule,
    Phase,
    PlanConfig,
    ScheduledPlan,
    SourceSpec,
)

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _source_of(plan: ScheduledPlan, ids: NDArray[np.int64]) -> NDArray[np.int64]:
    shard, _ = plan.locate(ids)
    return np.searchsorted(plan.source_shard_offsets, shard, side="right") - 1


@st.composite
def scheduled(draw: st.DrawFn) -> tuple[list[SourceSpec], MixtureSchedule, PlanConfig, int]:
    n = draw(st.integers(1, 3))
    srcs = [
        SourceSpec(
            shard_sizes=np.array(draw(st.lists(st.integers(1, 30), min_size=1, max_size=8))),
            name=f"s{i}@v1",
        )
        for i in range(n)
    ]
    batch = draw(st.sampled_from([1, 2, 4, 6, 12]))
    parts = draw(st.sampled_from([p for p in (1, 2, 3, 4, 6) if batch % p == 0]))
    total = sum(s.num_samples for s in srcs)
    epoch_size = draw(st.one_of(st.none(), st.integers(batch, 3 * total + batch)))
    if epoch_size is None and total < batch:
        epoch_size = batch  # at least one global batch
    num_batches = (epoch_size or total) // batch
    phases = []
    until = 0
    for _ in range(draw(st.integers(0, 3))):
        until += draw(st.integers(1, max(1, 2 * num_batches)))
        ws = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n).filter(sum))
        ramp = draw(st.booleans())
        ends = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n).filter(sum))
        phases.append(Phase(until=until, weights=ws, end_weights=ends if ramp else None, steps=3))
    last = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n).filter(sum))
    phases.append(Phase(weights=last))
    cfg = PlanConfig(
        seed=draw(st.integers(0, 2**32)),
        global_batch_size=batch,
        num_partitions=parts,
        shuffle=draw(st.booleans()),
        tail="drop" if epoch_size is None or epoch_size % batch == 0 else "pad",
        epoch_size=epoch_size,
    )
    return srcs, MixtureSchedule(phases), cfg, draw(st.integers(0, 3))


@given(scheduled())
@SETTINGS
def test_each_segment_takes_its_weights_share_and_each_sample_its_repeat_budget(
    case: tuple[list[SourceSpec], MixtureSchedule, PlanConfig, int],
) -> None:
    srcs, schedule, cfg, epoch = case
    plan = ScheduledPlan(srcs, cfg, epoch, schedule)
    b = cfg.global_batch_size
    for k in range(plan.num_segments):
        a, z = plan.segment_bounds(k)
        ids = plan.global_batches(a, z)
        counts = np.bincount(_source_of(plan, ids), minlength=len(srcs))
        weights = np.array(plan.segment_weights[k])
        if k + 1 < plan.num_segments or plan.num_samples == plan.num_positions:
            # Every item of the segment is read: the counts are the weights' exact share.
            assert counts.tolist() == plan.segment_counts[k].tolist()
            exact = (z - a) * b * weights / weights.sum()
            assert np.all(np.abs(counts - exact) < 1)
    if plan.num_samples != plan.num_positions:
        return  # pad: the last segment wraps around; exactness is checked when it divides
    ids = plan.global_batches(0, plan.num_batches)
    source = _source_of(plan, ids)
    for s, src in enumerate(srcs):
        seen = Counter(ids[source == s].tolist())
        total = plan.source_totals[s]
        assert sum(seen.values()) == total
        lo, hi = total // src.num_samples, -(-total // src.num_samples)
        start = int(plan.shard_starts[plan.source_shard_offsets[s]])
        per_sample = [seen.get(start + i, 0) for i in range(src.num_samples)]
        assert min(per_sample) >= lo and max(per_sample) <= hi


@given(scheduled(), st.data())
@SETTINGS
def test_any_world_size_reads_the_same_global_batches_and_resumes_exactly(
    case: tuple[list[SourceSpec], MixtureSchedule, PlanConfig, int], data: st.DataObject
) -> None:
    srcs, schedule, cfg, epoch = case
    plan = ScheduledPlan(srcs, cfg, epoch, schedule)
    b = cfg.global_batch_size
    full = plan.global_batches(0, plan.num_batches).reshape(plan.num_batches, b)
    # A resume point, preferably on a segment boundary, and a world size after it.
    cuts = [*plan.segment_starts.tolist(), data.draw(st.integers(0, plan.num_batches - 1))]
    start = data.draw(st.sampled_from(cuts))
    world = data.draw(st.sampled_from([w for w in (1, 2, 3, 4, 6, 12) if b % w == 0]))
    resumed = ScheduledPlan(srcs, cfg, epoch, schedule)  # a fresh process: nothing cached
    todo = np.arange(start, plan.num_batches)
    got = np.concatenate([resumed.rank_batches(todo, r, world) for r in range(world)], axis=1)
    np.testing.assert_array_equal(got, full[start:])
    # The shard schedule covers every shard each rank reads from there.
    for r in range(world):
        shards = set(resumed.rank_shards(r, world, start).tolist())
        read = resumed.locate(resumed.rank_batches(todo, r, world).ravel())[0]
        assert set(read.tolist()) <= shards


def test_steps_count_over_epochs_and_the_last_phase_stays() -> None:
    srcs = [SourceSpec(shard_sizes=np.full(4, 10)), SourceSpec(shard_sizes=np.full(4, 10))]
    cfg = PlanConfig(seed=1, global_batch_size=8)  # 80 samples: 10 batches an epoch
    sched = MixtureSchedule([Phase(until=15, weights=(3, 1)), Phase(weights=(0, 1))])
    first, second, third = (ScheduledPlan(srcs, cfg, e, sched) for e in range(3))
    assert first.num_segments == 1 and first.segment_counts.tolist() == [[60, 20]]
    assert second.segment_starts.tolist() == [0, 5]
    assert second.segment_counts.tolist() == [[30, 10], [0, 40]]
    assert second.source_totals == [30, 50]
    assert third.segment_counts.tolist() == [[0, 80]]
    # Source 1 is repeated in epoch 2 (80 of 40 samples): each sample exactly twice.
    ids = third.global_batches(0, third.num_batches)
    assert set(Counter(ids.tolist()).values()) == {2}


def test_linear_phase_moves_in_equal_steps() -> None:
    sched = MixtureSchedule([Phase(until=100, weights=(1.0, 0.0), end_weights=(0.0, 1.0))])
    pieces = sched.pieces()
    assert len(pieces) == DEFAULT_RAMP_STEPS + 1
    assert [p[0] for p in pieces[:3]] == [0, 6, 12]
    assert pieces[0][1][0] == pytest.approx(1 - 3 / 100)
    assert pieces[-1] == (100, (0.0, 1.0))
    firsts = [p[1][0] for p in pieces]
    assert firsts == sorted(firsts, reverse=True)


def test_a_one_phase_schedule_takes_exact_shares_like_a_weighted_plan() -> None:
    srcs = [SourceSpec(shard_sizes=np.full(5, 20)), SourceSpec(shard_sizes=np.full(5, 20))]
    cfg = PlanConfig(seed=2, global_batch_size=10, epoch_size=200)
    plan = ScheduledPlan(srcs, cfg, 0, MixtureSchedule([Phase(weights=(3, 1))]))
    weighted = EpochPlan(
        [
            SourceSpec(shard_sizes=np.full(5, 20), weight=3.0),
            SourceSpec(shard_sizes=np.full(5, 20), weight=1.0),
        ],
        cfg,
        0,
    )
    assert plan.source_totals == weighted.source_totals == [150, 50]
    assert plan.fingerprint != weighted.fingerprint


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MixtureSchedule([]), "non-empty list of Phase"),
        (lambda: MixtureSchedule([Phase(weights=(1,)), Phase(weights=(1,))]), "no 'until'"),
        (
            lambda: MixtureSchedule([Phase(until=5, weights=(1,)), Phase(until=5, weights=(1,))]),
            "increasing",
        ),
        (
            lambda: MixtureSchedule([Phase(until=5, weights=(1, 2)), Phase(weights=(1,))]),
            "one weight per source",
        ),
        (lambda: Phase(weights=(0, 0)), "all 0"),
        (lambda: Phase(weights=(1, -1)), ">= 0"),
        (lambda: Phase(weights=(1, float("nan"))), "finite"),
        (lambda: Phase(weights=(1,), end_weights=(1, 2), until=3), "end_weights"),
        (lambda: Phase(weights=(1,), until=0), "until"),
        (lambda: MixtureSchedule.from_params([{"weights": [1], "bogus": 1}]), "bogus"),
    ],
)
def test_bad_schedules_are_one_clear_error(make: object, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make()  # type: ignore[operator]


def test_a_schedule_must_fit_the_sources() -> None:
    srcs = [
        SourceSpec(shard_sizes=np.full(2, 8), repeat=2.0),
        SourceSpec(shard_sizes=np.array([8])),
    ]
    cfg = PlanConfig(global_batch_size=4)
    with pytest.raises(PlanError, match="3 weights per phase but there are 2 sources"):
        ScheduledPlan(srcs, cfg, 0, MixtureSchedule([Phase(weights=(1, 1, 1))]))
    with pytest.raises(PlanError, match="sets repeat"):
        ScheduledPlan(srcs, cfg, 0, MixtureSchedule([Phase(weights=(1, 1))]))
