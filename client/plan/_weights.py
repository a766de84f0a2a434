"""Mixture schedules: per-source weights as a function of the training step.

A :class:`MixtureSchedule` is a list of :class:`Phase` s, each ending at a global step
(global batches since the start of the run, ``epoch x num_batches + batch``): constant
weights, or weights moving linearly from ``weights`` to ``end_weights`` in ``steps`` equal
constant pieces. The plan only ever sees the constant pieces (:meth:`MixtureSchedule.pieces`),
so a schedule is as pure as the rest of the plan: a list of ``(first step, weights)``.

>>> s = MixtureSchedule([Phase(until=100, weights=(1, 0)),
...                      Phase(until=200, weights=(1, 0), end_weights=(0, 1), steps=2),
...                      Phase(weights=(0, 1))])
>>> [(start, [round(w, 2) for w in ws]) for start, ws in s.pieces()]
[(0, [1.0, 0.0]), (100, [0.75, 0.25]), (150, [0.25, 0.75]), (200, [0.0, 1.0])]
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import PlanError

__all__ = ["MixtureSchedule", "Phase"]

DEFAULT_RAMP_STEPS = 16
"""Constant pieces a linear phase is cut into unless it says otherwise."""


def _weights(value: object, where: str) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise PlanError(f"{where} must be a non-empty list of weights, one per source")
    out = []
    for i, w in enumerate(value):
        if not isinstance(w, numbers.Real) or isinstance(w, bool) or not math.isfinite(w):
            raise PlanError(f"{where}[{i}] must be a finite number >= 0, got {w!r}")
        if w < 0:
            raise PlanError(f"{where}[{i}] must be >= 0, got {w!r}")
        out.append(float(w))
    if sum(out) <= 0:
        raise PlanError(f"{where} are all 0: at least one source needs a weight > 0")
    return tuple(out)


@dataclass(frozen=True)
class Phase:
    """Weights (one per source, in the sources' order) in force until global step ``until``.

    ``until=None`` (only for the last phase): to the end of training. With ``end_weights``,
    the weights move linearly from ``weights`` to ``end_weights`` over the phase, as
    ``steps`` constant pieces of equal length (each at the weights of its midpoint).
    """

    weights: Sequence[float]
    until: int | None = None
    end_weights: Sequence[float] | None = None
    steps: int = DEFAULT_RAMP_STEPS

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", _weights(self.weights, "Phase.weights"))
        if self.end_weights is not None:
            ends = _weights(self.end_weights, "Phase.end_weights")
            if len(ends) != len(self.weights):
                raise PlanError(
                    f"Phase.end_weights has {len(ends)} weights but weights has "
                    f"{len(self.weights)}: give one per source in both"
                )
            object.__setattr__(self, "end_weights", ends)
        for name, low in (("until", 1), ("steps", 1)):
            value = getattr(self, name)
            if value is None and name == "until":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PlanError(f"Phase.{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class MixtureSchedule:
    """Per-source weights over training: phases in order, the last one open-ended.

    Every phase gives one weight per source (0 leaves a source out for that phase). The
    schedule is part of the plan: it is saved in every resume state (``plan["schedule"]``)
    and in the plan's fingerprint, and a resume with another schedule is refused.
    """

    phases: Sequence[Phase]

    def __post_init__(self) -> None:
        phases = tuple(self.phases) if isinstance(self.phases, Sequence) else None
        if not phases or not all(isinstance(p, Phase) for p in phases):
            raise PlanError("MixtureSchedule needs a non-empty list of Phase(...)")
        object.__setattr__(self, "phases", phases)
        width = len(phases[0].weights)
        last = 0
        for i, phase in enumerate(phases):
            if len(phase.weights) != width:
                raise PlanError(
                    f"MixtureSchedule phase {i} has {len(phase.weights)} weights, phase 0 has "
                    f"{width}: every phase gives one weight per source"
                )
            if phase.until is None and i != len(phases) - 1:
                raise PlanError(
                    f"MixtureSchedule phase {i} has no 'until' but is not the last phase: "
                    f"only the last phase may run to the end of training"
                )
            if phase.until is not None and phase.until <= last:
                raise PlanError(
                    f"MixtureSchedule phase {i} ends at step {phase.until}, not after the "
                    f"previous phase's end ({last}): phases must end at increasing steps"
                )
            last = phase.until if phase.until is not None else last

    @property
    def num_sources(self) -> int:
        """Weights per phase (the sources the schedule is for)."""
        return len(self.phases[0].weights)

    def pieces(self) -> list[tuple[int, tuple[float, ...]]]:
        """``(first step, weights)`` of every constant piece, in order; the last piece
        lasts forever (the last phase's weights stay in force after its ``until``)."""
        out: list[tuple[int, tuple[float, ...]]] = []
        start = 0
        for phase in self.phases:
            stop = phase.until
            if phase.end_weights is None or stop is None:
                out.append((start, tuple(phase.weights)))
            else:
                length = stop - start
                steps = min(phase.steps, length)
                for k in range(steps):
                    a = start + length * k // steps
                    b = start + length * (k + 1) // steps
                    f = ((a + b) / 2 - start) / length
                    ws = tuple(
                        w0 + (w1 - w0) * f
                        for w0, w1 in zip(phase.weights, phase.end_weights, strict=True)
                    )
                    out.append((a, ws))
            if stop is not None:
                start = stop
        if self.phases[-1].until is not None:
            last = self.phases[-1]
            out.append((start, tuple(last.end_weights or last.weights)))
        # Merge equal neighbours: fewer, longer segments mix and cache better.
        merged = [out[0]]
        for piece in out[1:]:
            if piece[1] != merged[-1][1]:
                merged.append(piece)
        return merged

    def to_params(self) -> list[dict[str, Any]]:
        """The schedule as JSON-able plan parameters (saved in resume states)."""
        out: list[dict[str, Any]] = []
        for p in self.phases:
            item: dict[str, Any] = {"weights": list(p.weights), "until": p.until}
            if p.end_weights is not None:
                item["end_weights"] = list(p.end_weights)
                item["steps"] = p.steps
            out.append(item)
        return out

    @classmethod
    def from_params(cls, params: object) -> MixtureSchedule | None:
        """The schedule of :meth:`to_params` output (``None`` for ``None``)."""
        if params is None:
            return None
        if not isinstance(params, list) or not all(isinstance(p, Mapping) for p in params):
            raise PlanError(f"a saved mixture schedule must be a list of phases, got {params!r}")
        known = {"weights", "until", "end_weights", "steps"}
        for i, p in enumerate(params):
            unknown = sorted(set(p) - known)
            if unknown or "weights" not in p:
                raise PlanError(
                    f"saved mixture schedule phase {i}: unknown fields {unknown} or no "
                    f"'weights' (expected {sorted(known)})"
                )
        return cls([Phase(**dict(p)) for p in params])
