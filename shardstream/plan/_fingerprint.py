"""The plan's fingerprint: a digest of everything the order depends on except the epoch.

The resume state (:class:`shardstream.client.state.ReaderState`, the one home of that
concept) carries it, so a state is never applied to a plan over other data, parameters or
algorithm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardstream.plan._config import PlanConfig, SourceSpec

if TYPE_CHECKING:
    from shardstream.plan._weights import MixtureSchedule


SCHEDULED_ORDER = 2
"""Version of the scheduled plan's order on top of ``PLAN_ALGORITHM`` (hashed with the
schedule, so only scheduled plans' fingerprints change with it). 2: a subsampled source's
cursor advances by the earlier epochs' own shares (1 re-read samples once a schedule
changed a source's share between epochs). Plans without a schedule keep their order and
fingerprint, and their saved states (format 1 too) still resume."""


def plan_fingerprint(
    algorithm: int,
    config: PlanConfig,
    sources: Sequence[SourceSpec],
    schedule: MixtureSchedule | None = None,
) -> str:
    """sha256 (first 32 hex digits) of the algorithm version, the config, every source's
    name/version, mixture setting and shard sizes, and the mixture schedule if any (a plan
    without one hashes as it always did)."""
    h = hashlib.sha256(f"{algorithm}:{config!r}".encode())
    for s in sources:
        h.update(repr((s.name, s.weight, s.repeat, s.count)).encode())
        h.update(np.ascontiguousarray(s.shard_sizes, dtype="<i8").tobytes())
    if schedule is not None:
        tag = f"schedule:{SCHEDULED_ORDER}:".encode()
        h.update(tag + repr(schedule.to_params()).encode())
    return h.hexdigest()[:32]
