"""The epoch plan's user-facing names, kept here for code written against the client.

The plan's home is :mod:`shardstream.plan` (the shared core: the server recomputes it for the
audit); this module only re-exports the names users import from ``shardstream.client.plan``.

>>> from shardstream.client.plan import EpochPlan
>>> import shardstream.plan
>>> EpochPlan is shardstream.plan.EpochPlan
True
"""

from shardstream.plan import (
    PLAN_ALGORITHM,
    EpochPlan,
    MixtureSchedule,
    Phase,
    PlanConfig,
    ScheduledPlan,
    SourceSpec,
    Tail,
    make_plan,
)

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
