"""Under a mixture schedule a subsampled source continues where the previous epoch stopped
(issue 36): its cursor advances by what the earlier epochs took, which the schedule
changes from epoch to epoch, so consecutive epochs see disjoint samples until the source
is covered (docs/plan.md, *Mixture schedules*)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from shardstream.plan import (
    MixtureSchedule,
    Phase,
    PlanConfig,
    ScheduledPlan,
    SourceSpec,
    plan_fingerprint,
)
from shardstream.plan._scheduled import (
    earlier_totals,
    segment_counts,
    segments_of,
)

BATCH = 10
SOURCES = [SourceSpec(shard_sizes=np.full(4, 500)), SourceSpec(shard_sizes=np.full(4, 500))]


def _ids_of_first_source(schedule: MixtureSchedule, epoch: int) -> Any:
    config = PlanConfig(seed=3, global_batch_size=BATCH, epoch_size=2000)
    plan = ScheduledPlan(SOURCES, config, epoch, schedule)
    ids = plan.global_batches(0, plan.num_batches)
    return np.sort(ids[ids < 2000])


def test_a_share_that_shrinks_continues_where_the_last_epoch_stopped() -> None:
    # 40 % of the first source in epoch 0 (800 of 2,000), then 20 % (400) each epoch.
    schedule = MixtureSchedule([Phase(until=200, weights=(0.4, 0.6)), Phase(weights=(1, 4))])
    seen = [_ids_of_first_source(schedule, e) for e in range(4)]
    assert [len(s) for s in seen] == [800, 400, 400, 400]
    every = np.concatenate(seen)
    # Disjoint epochs that cover the source: nothing re-read, nothing never reached.
    assert len(np.unique(every)) == 2000


def test_a_share_that_grows_continues_too() -> None:
    schedule = MixtureSchedule([Phase(until=200, weights=(1, 4)), Phase(weights=(0.4, 0.6))])
    seen = [_ids_of_first_source(schedule, e) for e in range(3)]
    assert [len(s) for s in seen] == [400, 800, 800]
    assert len(np.unique(np.concatenate(seen))) == 2000


def _brute_force(pieces: Any, epoch: int, n: int, m: int) -> list[list[int]]:
    """Per source, the totals of epochs 0 .. epoch-1, one epoch at a time."""
    out: list[list[int]] = [[], []]
    for e in range(epoch):
        counts = segment_counts(segments_of(pieces, e, n), m, BATCH)
        for s in range(2):
            out[s].append(sum(row[s] for row in counts))
    return out


def test_the_earlier_epochs_are_summed_per_piece_not_per_epoch() -> None:
    # Phase ends inside epochs and on their edges, a ramp of many pieces, a long tail.
    schedule = MixtureSchedule(
        [
            Phase(until=130, weights=(3, 1)),
            Phase(until=400, weights=(3, 1), end_weights=(1, 3), steps=7),
            Phase(until=1000, weights=(1, 1)),
            Phase(weights=(1, 9)),
        ]
    )
    pieces = schedule.pieces()
    n, m = 199, 1999  # 199 batches of 10 (drop): a tail of 9 in every epoch's last segment
    for epoch in (0, 1, 2, 3, 6, 11, 40):
        grouped = earlier_totals(pieces, epoch, n, m, BATCH)
        want = _brute_force(pieces, epoch, n, m)
        for s in range(2):
            got = sorted(t for t, k in grouped[s] for _ in range(k))
            assert got == sorted(want[s]), (epoch, s)
    # A billion epochs: as many groups as pieces, not epochs.
    far = earlier_totals(pieces, 10**9, n, m, BATCH)
    assert sum(k for _, k in far[0]) == 10**9 and len(far[0]) <= 2 * len(pieces)


def test_the_scheduled_order_change_changes_only_scheduled_fingerprints() -> None:
    """States of a scheduled plan saved before the change are refused (another order from
    epoch 1 on); plans without a schedule keep their fingerprint (and their order)."""
    config = PlanConfig(seed=1, global_batch_size=BATCH)
    schedule = MixtureSchedule([Phase(weights=(1, 1))])
    old = hashlib.sha256(f"1:{config!r}".encode())
    for s in SOURCES:
        old.update(repr((s.name, s.weight, s.repeat, s.count)).encode())
        old.update(np.ascontiguousarray(s.shard_sizes, dtype="<i8").tobytes())
    plain = old.copy()
    old.update(b"schedule:" + repr(schedule.to_params()).encode())
    assert plan_fingerprint(1, config, SOURCES) == plain.hexdigest()[:32]
    assert plan_fingerprint(1, config, SOURCES, schedule) != old.hexdigest()[:32]
