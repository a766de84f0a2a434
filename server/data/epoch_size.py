"""A run's epoch size from a stored plan: what the console's progress, its mixture schedule
and the mixture history read positions against.

A stored plan is whatever a client sent (older servers did not bound its numbers), so
every value is checked here; anything unexpected leaves the size unknown (``None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shardstream.server.models import RunSourceRow
from shardstream.wire import SourceMixture, stored_plan_params

__all__ = ["MAX_EPOCH_SAMPLES", "epoch_samples"]

MAX_EPOCH_SAMPLES = 2**62
"""Largest epoch size the server believes; a plan saying more is shown without one."""


def epoch_samples(plan: dict[str, Any], sources: Sequence[tuple[RunSourceRow, int]]) -> int | None:
    """Samples in one epoch: the plan's ``epoch_size``, else the sources' (mixture counts,
    else the versions' sample totals times their repeat); None when unknown.

    A stored plan is whatever a client sent (older servers did not bound its numbers), so
    every value is checked here: a value that is not a sensible count or repeat (negative,
    a bool, ``1e308``, beyond :data:`MAX_EPOCH_SAMPLES`) leaves the size unknown rather
    than failing the page for every viewer.
    """
    params = stored_plan_params(plan)
    size = params.get("epoch_size")
    if isinstance(size, int) and _is_count(size) and 0 < size <= MAX_EPOCH_SAMPLES:
        return size
    mixture = params.get("mixture")
    total = 0
    for i, (_, version_samples) in enumerate(sources):
        count = None
        repeat = 1.0
        if isinstance(mixture, list) and i < len(mixture):
            entry = SourceMixture.read(mixture[i])
            if entry.samples is not None:
                count = int(entry.samples)
            if entry.repeat:
                repeat = float(entry.repeat)
        if count is None:
            samples = version_samples * repeat
            if not (math.isfinite(samples) and 0 <= samples <= MAX_EPOCH_SAMPLES):
                return None
            count = int(samples)
        total += count
    return total if 0 < total <= MAX_EPOCH_SAMPLES else None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
