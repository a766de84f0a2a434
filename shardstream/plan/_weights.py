"""Mixture schedules: per-source weights as a function of the training step or of the
tokens consumed.

A :class:`MixtureSchedule` is a list of :class:`Phase` s, each ending at a global step
(global batches since the start of the run, ``epoch x num_batches + batch``), or each at a
count of tokens consumed: constant weights, or weights moving linearly from ``weights`` to
``end_weights`` in ``steps`` equal constant pieces. A schedule in tokens also carries the
tokens a step consumes (``tokens_per_step``, fixed by the global batch and the packing; a
reader sets it): phase ends in tokens become steps by ``ceil(tokens / tokens_per_step)``.
The plan only ever sees the constant pieces (:meth:`MixtureSchedule.pieces`), so a schedule
is as pure as the rest of the plan: a list of ``(first step, weights)``.

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
from dataclasses import dataclass, replace
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


def _count(value: object, where: str, low: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise PlanError(f"{where} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class Phase:
    """Weights (one per source, in the sources' order) in force until global step ``until``,
    or until ``until_tokens`` tokens have been consumed (give one of the two).

    Neither (only for the last phase): to the end of training. With ``end_weights``,
    the weights move linearly from ``weights`` to ``end_weights`` over the phase, as
    ``steps`` constant pieces of equal length (each at the weights of its midpoint).
    """

    weights: Sequence[float]
    until: int | None = None
    end_weights: Sequence[float] | None = None
    steps: int = DEFAULT_RAMP_STEPS
    until_tokens: int | None = None

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
        for name in ("until", "until_tokens", "steps"):
            value = getattr(self, name)
            if value is not None or name == "steps":
                _count(value, f"Phase.{name}")
        if self.until is not None and self.until_tokens is not None:
            raise PlanError(
                f"Phase sets both until={self.until} (a step) and until_tokens="
                f"{self.until_tokens}: a phase ends at a step or at a count of tokens, give one"
            )

    @property
    def end(self) -> int | None:
        """Where the phase ends, in its own unit (steps or tokens); None: open-ended."""
        return self.until if self.until_tokens is None else self.until_tokens


@dataclass(frozen=True)
class MixtureSchedule:
    """Per-source weights over training: phases in order, the last one open-ended.

    Every phase gives one weight per source (0 leaves a source out for that phase) and ends
    at a step (``Phase.until``) or, in a schedule in tokens, at a count of tokens consumed
    (``Phase.until_tokens``); one schedule uses one unit. ``tokens_per_step`` (a schedule in
    tokens only) is the tokens one global step consumes; a reader sets it from its batches
    (:meth:`with_tokens_per_step`), and phase ``i`` then ends at step
    ``ceil(until_tokens / tokens_per_step)``: its first ``until_tokens`` tokens are all at
    its weights. The schedule is part of the plan: it is saved in every resume state
    (``plan["schedule"]``) and in the plan's fingerprint, and a resume with another
    schedule (or another ``tokens_per_step``) is refused.

    >>> s = MixtureSchedule([Phase(until_tokens=1000, weights=(4, 1)), Phase(weights=(1, 1))])
    >>> s.with_tokens_per_step(300).step_ends()
    (4, None)
    """

    phases: Sequence[Phase]
    tokens_per_step: int | None = None

    def __post_init__(self) -> None:
        phases = tuple(self.phases) if isinstance(self.phases, Sequence) else None
        if not phases or not all(isinstance(p, Phase) for p in phases):
            raise PlanError("MixtureSchedule needs a non-empty list of Phase(...)")
        object.__setattr__(self, "phases", phases)
        width = len(phases[0].weights)
        unit, first = None, 0  # the unit of the first phase with an end, and its index
        last = 0
        for i, phase in enumerate(phases):
            if len(phase.weights) != width:
                raise PlanError(
                    f"MixtureSchedule phase {i} has {len(phase.weights)} weights, phase 0 has "
                    f"{width}: every phase gives one weight per source"
                )
            if phase.end is None:
                if i != len(phases) - 1:
                    raise PlanError(
                        f"MixtureSchedule phase {i} has no 'until' (nor 'until_tokens') but is "
                        f"not the last phase: only the last phase may run to the end of training"
                    )
                continue
            name = "until_tokens" if phase.until_tokens is not None else "until"
            if unit is None:
                unit, first = name, i
            elif name != unit:
                raise PlanError(
                    f"MixtureSchedule phase {i} ends by {name} but phase {first} by {unit}: "
                    f"give every phase's end in one unit, steps (until) or tokens "
                    f"(until_tokens)"
                )
            what = "token" if name == "until_tokens" else "step"
            if phase.end <= last:
                raise PlanError(
                    f"MixtureSchedule phase {i} ends at {what} {phase.end}, not after the "
                    f"previous phase's end ({last}): phases must end at increasing {what}s"
                )
            last = phase.end
        if self.tokens_per_step is not None:
            _count(self.tokens_per_step, "MixtureSchedule.tokens_per_step")
            if not self.in_tokens:
                raise PlanError(
                    "MixtureSchedule.tokens_per_step is set but no phase ends by tokens "
                    "(Phase.until_tokens): drop it, or give the phase ends in tokens"
                )
            self.step_ends()  # phases too close for a step each fail here

    @property
    def num_sources(self) -> int:
        """Weights per phase (the sources the schedule is for)."""
        return len(self.phases[0].weights)

    @property
    def in_tokens(self) -> bool:
        """Whether the phases end at counts of tokens (:attr:`Phase.until_tokens`)."""
        return any(p.until_tokens is not None for p in self.phases)

    def with_tokens_per_step(self, tokens_per_step: int) -> MixtureSchedule:
        """This schedule with a step of ``tokens_per_step`` tokens (itself unless it is in
        tokens): what a reader plans with."""
        if not self.in_tokens:
            return self
        return replace(self, tokens_per_step=tokens_per_step)

    def step_ends(self) -> tuple[int | None, ...]:
        """The global step each phase ends at (``None``: the open-ended last phase).

        A schedule in tokens needs :attr:`tokens_per_step`; phase ends a step maps onto
        the same step are refused (the later phase would have no step)."""
        if not self.in_tokens:
            return tuple(p.until for p in self.phases)
        per = self.tokens_per_step
        if per is None:
            raise PlanError(
                "this mixture schedule ends its phases by tokens (Phase.until_tokens) but "
                "does not know the tokens a step consumes: a reader sets it from its packing "
                "(PackOptions with fixed rows); a plan of your own needs "
                "MixtureSchedule(phases, tokens_per_step=global batch rows x seq_len)"
            )
        ends: list[int | None] = []
        for i, phase in enumerate(self.phases):
            tokens = phase.until_tokens
            end = None if tokens is None else -(-tokens // per)
            before = ends[-1] if ends else 0
            if end is not None and before is not None and end <= before:
                raise PlanError(
                    f"MixtureSchedule phase {i} ends at token {tokens:,}, within the previous "
                    f"phase's last step ({before - 1}, at {per:,} tokens a step): it would have "
                    f"no step of its own; end the phases at least {per:,} tokens apart, or "
                    f"drop one"
                )
            ends.append(end)
        return tuple(ends)

    def in_steps(self) -> MixtureSchedule:
        """The same schedule with every phase ending at its step (itself when it is in
        steps already): for arithmetic that counts steps (the server's mixture figures)."""
        if not self.in_tokens:
            return self
        phases = [
            replace(p, until=end, until_tokens=None)
            for p, end in zip(self.phases, self.step_ends(), strict=True)
        ]
        return MixtureSchedule(phases)

    def pieces(self) -> list[tuple[int, tuple[float, ...]]]:
        """``(first step, weights)`` of every constant piece, in order; the last piece
        lasts forever (the last phase's weights stay in force after its end)."""
        out: list[tuple[int, tuple[float, ...]]] = []
        start = 0
        ends = self.step_ends()
        for phase, stop in zip(self.phases, ends, strict=True):
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
        if ends[-1] is not None:
            last = self.phases[-1]
            out.append((start, tuple(last.end_weights or last.weights)))
        # Merge equal neighbours: fewer, longer segments mix and cache better.
        merged = [out[0]]
        for piece in out[1:]:
            if piece[1] != merged[-1][1]:
                merged.append(piece)
        return merged

    def to_params(self) -> list[dict[str, Any]] | dict[str, Any]:
        """The schedule as JSON-able plan parameters (saved in resume states): a list of
        phases, or for a schedule in tokens ``{"tokens_per_step": ..., "phases": [...]}``."""
        key = "until_tokens" if self.in_tokens else "until"
        out: list[dict[str, Any]] = []
        for p in self.phases:
            item: dict[str, Any] = {"weights": list(p.weights), key: p.end}
            if p.end_weights is not None:
                item["end_weights"] = list(p.end_weights)
                item["steps"] = p.steps
            out.append(item)
        if self.in_tokens:
            return {"tokens_per_step": self.tokens_per_step, "phases": out}
        return out

    @classmethod
    def from_params(cls, params: object) -> MixtureSchedule | None:
        """The schedule of :meth:`to_params` output (``None`` for ``None``)."""
        if params is None:
            return None
        per_step = None
        if isinstance(params, Mapping):
            if set(params) != {"tokens_per_step", "phases"}:
                raise PlanError(
                    f"a saved mixture schedule in tokens has the fields ['phases', "
                    f"'tokens_per_step'], got {sorted(params)}"
                )
            per_step, params = params["tokens_per_step"], params["phases"]
        if not isinstance(params, list) or not all(isinstance(p, Mapping) for p in params):
            raise PlanError(f"a saved mixture schedule must be a list of phases, got {params!r}")
        known = {"weights", "until", "until_tokens", "end_weights", "steps"}
        for i, p in enumerate(params):
            unknown = sorted(set(p) - known)
            if unknown or "weights" not in p:
                raise PlanError(
                    f"saved mixture schedule phase {i}: unknown fields {unknown} or no "
                    f"'weights' (expected {sorted(known)})"
                )
        return cls([Phase(**dict(p)) for p in params], tokens_per_step=per_step)
