"""A run's mixture schedule on its console page: the phases, the weights in force, and the
samples each source has given the run so far.

Everything is recomputed from the latest checkpoint's plan (``plan["schedule"]``, the
global batch size, the tail rule) and the epoch size, with the plan's own arithmetic
(:mod:`shardstream.client.plan._scheduled`): whole segments count exactly, the segment the
run is in proportionally (inside a segment the sources are mixed evenly). A stored plan
is whatever a client sent, so anything unexpected leaves the section out rather than
failing the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.client.plan._scheduled import epoch_segments, split_by_weights
from shardstream.client.plan._weights import MixtureSchedule
from shardstream.errors import PlanError

MAX_EPOCHS = 10_000
"""Epochs the console sums over at most (a plan claiming more is not shown)."""


@dataclass(frozen=True)
class SourceShare:
    """One source's part of the run so far."""

    name: str
    weight_now: float  # its share of the weights in force at the latest checkpoint
    samples: int  # samples it gave the run so far
    share: float  # of all samples so far


@dataclass(frozen=True)
class MixtureView:
    """What the run page shows of a schedule."""

    phases: list[str]
    sources: list[SourceShare]
    step: int


def _phase_text(phase: Mapping[str, Any], start: int) -> str:
    until = phase.get("until")
    span = f"steps {start:,}-{until:,}" if until is not None else f"steps {start:,}-"
    weights = ":".join(f"{w:g}" for w in phase["weights"])
    ends = phase.get("end_weights")
    if ends is not None:
        weights += " -> " + ":".join(f"{w:g}" for w in ends)
    return f"{span}: {weights}"


def mixture_view(
    plan: Mapping[str, Any], names: Sequence[str], epoch_samples: int | None, epoch: int,
    sample_in_epoch: int,
) -> MixtureView | None:  # fmt: skip
    """The schedule section for a run at ``(epoch, sample_in_epoch)``, or None when the
    plan has no schedule (or one the console cannot read)."""
    params = plan.get("plan") if isinstance(plan.get("plan"), Mapping) else plan
    if not isinstance(params, Mapping) or params.get("schedule") is None:
        return None
    batch = params.get("global_batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        return None
    if not epoch_samples or not 0 <= epoch <= MAX_EPOCHS:
        return None
    try:
        schedule = MixtureSchedule.from_params(params["schedule"])
    except (PlanError, TypeError, ValueError):
        return None
    if schedule is None or schedule.num_sources != len(names):
        return None
    drop = params.get("tail", "drop") != "pad"
    num_batches = epoch_samples // batch if drop else -(-epoch_samples // batch)
    if num_batches < 1:
        return None
    step_in_epoch = min(sample_in_epoch // batch, num_batches)
    totals = [0] * len(names)
    weights_now = schedule.pieces()[0][1]
    for e in range(epoch + 1):
        segs = epoch_segments(schedule, e, num_batches)
        for k, (a, z, weights) in enumerate(segs):
            items = (z - a) * batch if k + 1 < len(segs) else epoch_samples - a * batch
            counts = split_by_weights(items, weights)
            if e == epoch and a <= step_in_epoch:
                weights_now = weights  # the segment the run is in (or the last one reached)
            done = z - a if e < epoch else max(0, min(z, step_in_epoch) - a)
            for s, c in enumerate(counts):
                totals[s] += c if done == z - a else c * done // (z - a)
    consumed = sum(totals)
    weight_sum = sum(weights_now) or 1.0
    phases, start = [], 0
    for phase in schedule.to_params():
        phases.append(_phase_text(phase, start))
        until = phase["until"]
        start = until if isinstance(until, int) else start
    return MixtureView(
        phases=phases,
        sources=[
            SourceShare(name, w / weight_sum, n, n / consumed if consumed else 0.0)
            for name, w, n in zip(names, weights_now, totals, strict=True)
        ],
        step=epoch * num_batches + step_in_epoch,
    )
