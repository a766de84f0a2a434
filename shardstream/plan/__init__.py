"""The epoch plan: which sample each rank and worker reads, as pure numpy arithmetic.

It lives in the shared core because two parts compute it: the client reads by it, and the
server recomputes it to prove a run's history (the audit, a run's mixture figures). It imports
no part; every name a part needs is exported here, so nobody reaches into its private modules.
``shardstream.client.plan`` re-exports the user-facing names for code written against it.

>>> import numpy as np
>>> cfg = PlanConfig(seed=0, global_batch_size=4, num_partitions=2)
>>> plan = EpochPlan([SourceSpec(shard_sizes=np.array([4, 4]))], cfg, epoch=0)
>>> sorted(plan.global_batches(0, plan.num_batches).tolist())
[0, 1, 2, 3, 4, 5, 6, 7]

See ``docs/plan.md`` for the algorithm and why each property holds.
"""

from shardstream.plan._config import PlanConfig, SourceSpec, Tail
from shardstream.plan._defaults import default_shape
from shardstream.plan._epoch import PLAN_ALGORITHM, EpochPlan
from shardstream.plan._fingerprint import plan_fingerprint
from shardstream.plan._mixture import source_totals
from shardstream.plan._scheduled import (
    AnyPlan,
    ScheduledPlan,
    check_schedule,
    make_plan,
    segment_counts,
    segments_of,
    split_by_weights,
)
from shardstream.plan._weights import DEFAULT_RAMP_STEPS, MixtureSchedule, Phase

__all__ = [
    "DEFAULT_RAMP_STEPS",
    "PLAN_ALGORITHM",
    "AnyPlan",
    "EpochPlan",
    "MixtureSchedule",
    "Phase",
    "PlanConfig",
    "ScheduledPlan",
    "SourceSpec",
    "Tail",
    "check_schedule",
    "default_shape",
    "make_plan",
    "plan_fingerprint",
    "segment_counts",
    "segments_of",
    "source_totals",
    "split_by_weights",
]
