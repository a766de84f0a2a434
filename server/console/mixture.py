"""A run's mixture schedule on its console page: the phases, the weights in force, and the
samples each source has given the run so far.

Everything is recomputed from the latest checkpoint's plan (``plan["schedule"]``, the
global batch size, the tail rule) and the epoch size, with the plan's own arithmetic
(:class:`~shardstream.server.data.mixture_history.MixturePlan`): whole segments count
exactly, the segment the run is in proportionally (inside a segment the sources are mixed
evenly). A stored plan
is whatever a client sent, so anything unexpected leaves the section out rather than
failing the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.server.data.mixture_history import MixturePlan
from shardstream.wire import phase_end_text

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
    now: str  # where the run is: "step 18", or "36.9K tokens (step 18)" for a schedule in tokens
    unit: str  # what the phases end by: "global step" or "tokens consumed"


def _phase_texts(arithmetic: MixturePlan) -> list[str]:
    """Each phase and its weights: ``"steps 0-10: 3:1"``; a schedule whose phases end by
    tokens names its ends in tokens, with the steps they become: ``"until 2.0B tokens
    (step 123): 3:1"``, ``"from 2.0B tokens (step 123): 1:3"``."""
    labels = [phase_end_text(step, tokens) for step, tokens in arithmetic.phase_ends()]
    out, start = [], 0
    for i, phase in enumerate(arithmetic.schedule.phases):  # in steps (MixturePlan counts steps)
        until = phase.until
        if not arithmetic.phase_tokens:
            span = f"steps {start:,}-{until:,}" if until is not None else f"steps {start:,}-"
        elif until is None:
            span = f"from {labels[i - 1]}" if i else "all of training"
        else:
            span = f"{labels[i - 1]} until {labels[i]}" if i else f"until {labels[i]}"
        weights = ":".join(f"{w:g}" for w in phase.weights)
        if phase.end_weights is not None:
            weights += " -> " + ":".join(f"{w:g}" for w in phase.end_weights)
        out.append(f"{span}: {weights}")
        start = until if until is not None else start
    return out


def mixture_view(
    plan: Mapping[str, Any], names: Sequence[str], epoch_samples: int | None, epoch: int,
    sample_in_epoch: int,
) -> MixtureView | None:  # fmt: skip
    """The schedule section for a run at ``(epoch, sample_in_epoch)``, or None when the
    plan has no schedule (or one the console cannot read)."""
    if not 0 <= epoch <= MAX_EPOCHS:
        return None
    arithmetic = MixturePlan.of(plan, len(names), epoch_samples)
    if arithmetic is None:
        return None
    step = arithmetic.position(epoch, sample_in_epoch)
    totals = arithmetic.counts(0, step)
    weights_now = arithmetic.weights_at(step)  # for the run's next batch
    consumed = sum(totals)
    per_step = arithmetic.tokens_per_step
    return MixtureView(
        phases=_phase_texts(arithmetic),
        sources=[
            SourceShare(name, w, n, n / consumed if consumed else 0.0)
            for name, w, n in zip(names, weights_now, totals, strict=True)
        ],
        step=step,
        now=phase_end_text(step, step * per_step if per_step is not None else None),
        unit="global step" if per_step is None else "tokens consumed",
    )
