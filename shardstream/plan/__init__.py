"""The epoch plan: which sample each rank and worker reads, as pure numpy arithmetic.

>>> import numpy as np
>>> cfg = PlanConfig(seed=0, global_batch_size=4, num_partitions=2)
>>> plan = EpochPlan([SourceSpec(shard_sizes=np.array([4, 4]))], cfg, epoch=0)
>>> sorted(plan.global_batches(0, plan.num_batches).tolist())
[0, 1, 2, 3, 4, 5, 6, 7]

See ``docs/plan.md`` for the algorithm and why each property holds.
"""

from shardstream.client.plan._config import PlanConfig, SourceSpec, Tail
from shardstream.client.plan._epoch import PLAN_ALGORITHM, EpochPlan
from shardstream.client.plan._scheduled import ScheduledPlan, make_plan
from shardstream.client.plan._weights import MixtureSchedule, Phase

__all__ = [
    "PLAN_ALGORITHM",
    "EpochPlan",
    "MixtureSchedule",
    "Phase",
    "PlanConfig",
    "ScheduledPlan",
    "SourceSpec",
    "Tail",
    "make_plan",
]
