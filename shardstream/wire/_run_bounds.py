"""Bounds on what a run's plans, checkpoints and attempts may carry.

A plan is stored as sent and later *computed*: the audit recomputes the epoch plan with
its mixture schedule, the console and ``GET /v1/runs/{id}/mixture`` count the schedule's
pieces over the run's steps. Without bounds one write token's commit made those
computations run for minutes (a schedule of 64 linear phases x 10**6 pieces, a phase
ending at step 2**40, a position at epoch 2**40), and a scheduled plan at epoch 2**62
overflowed a database integer (SQLite answered 500). So the numbers that drive cost or
size are bounded where a request enters, each far beyond real training (which runs up to
about 10**8 steps and 10**5 epochs), and every refusal names the field and the bound:

* training steps (a checkpoint's ``step``, a resume's ``step``, a phase's ``until``):
  at most :data:`MAX_STEPS`;
* epochs (a checkpoint's ``epoch`` and its state's, a resume's): at most
  :data:`MAX_EPOCHS`; samples in an epoch (``sample_in_epoch``, a plan's
  ``epoch_size``): at most :data:`MAX_EPOCH_SAMPLES`; so a run's global step
  (``epoch x batches per epoch``) stays below 2**63 on every database;
* a mixture schedule: at most :data:`MAX_SCHEDULE_PHASES` phases making at most
  :data:`MAX_SCHEDULE_PIECES` constant pieces in all (a linear phase is its ``steps``
  pieces); phase ends in tokens and ``tokens_per_step`` at most :data:`MAX_TOKENS`, and
  each phase end at most :data:`MAX_STEPS` steps;
* an attempt's recorded plan changes: at most :data:`MAX_ATTEMPT_CHANGES` entries and
  :data:`MAX_ATTEMPT_CHANGES_BYTES` of JSON in all.

docs/server.md ("Bounds on runs") lists them for people.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo

from ._fields import PlanObject

__all__ = [
    "MAX_ATTEMPT_CHANGES",
    "MAX_ATTEMPT_CHANGES_BYTES",
    "MAX_EPOCHS",
    "MAX_EPOCH_SAMPLES",
    "MAX_SCHEDULE_PHASES",
    "MAX_SCHEDULE_PIECES",
    "MAX_STEPS",
    "MAX_TOKENS",
    "AttemptChanges",
    "BoundedPlan",
    "Epoch",
    "SampleInEpoch",
    "Step",
    "check_attempt_changes",
    "check_epoch",
    "check_plan_bounds",
    "check_sample",
    "check_step",
]

MAX_STEPS = 10**12
"""Largest training step (global batches since the run's start): 10,000 x a long run."""

MAX_EPOCHS = 10**6
"""Largest epoch number: 10 x the most epochs real training makes of a small dataset."""

MAX_EPOCH_SAMPLES = 10**12
"""Largest number of samples in one epoch (``sample_in_epoch``, ``epoch_size``)."""

MAX_SCHEDULE_PHASES = 256
"""Phases in one mixture schedule."""

MAX_SCHEDULE_PIECES = 1024
"""Constant pieces one mixture schedule makes in all (a constant phase is one piece, a
linear phase its ``steps``); the server counts every piece of a schedule it accepts."""

DEFAULT_RAMP_PIECES = 16
"""Pieces of a linear phase that does not give ``steps`` (the plan library's default)."""

MAX_TOKENS = 10**16
"""Largest ``until_tokens`` and ``tokens_per_step`` (10**16 tokens: 1,000 x the largest
training sets)."""

MAX_ATTEMPT_CHANGES = 32
"""Plan changes (``allow_changes`` accepted at resumes) one attempt may record."""

MAX_ATTEMPT_CHANGES_BYTES = 4096
"""Compact JSON bytes of one attempt's ``changes`` in all (a change names the parameters
that changed, with their old and new values)."""


def _bounded(value: int, bound: int, what: str) -> int:
    if value > bound:
        raise ValueError(f"{what} {value:,} is beyond the bound: at most {bound:,}")
    return value


def check_step(value: int) -> int:
    """``value`` unless it is beyond :data:`MAX_STEPS` (ValueError naming the bound)."""
    return _bounded(value, MAX_STEPS, "step")


def check_epoch(value: int) -> int:
    """``value`` unless it is beyond :data:`MAX_EPOCHS` (ValueError naming the bound)."""
    return _bounded(value, MAX_EPOCHS, "epoch")


def check_sample(value: int) -> int:
    """``value`` unless it is beyond :data:`MAX_EPOCH_SAMPLES`."""
    return _bounded(value, MAX_EPOCH_SAMPLES, "sample in an epoch")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_schedule(schedule: object, where: str) -> None:
    """Bound a stored mixture schedule's phases, pieces and ends; shapes this does not
    know are left to the plan library (the server counts only schedules it can read)."""
    per_step = None
    phases = schedule
    if isinstance(schedule, Mapping):
        per_step = _int(schedule.get("tokens_per_step"))
        phases = schedule.get("phases")
        if per_step is not None and per_step > MAX_TOKENS:
            raise ValueError(
                f"{where}.tokens_per_step {per_step:,} is beyond the bound: at most "
                f"{MAX_TOKENS:,} tokens"
            )
        where += ".phases"
    if not isinstance(phases, list):
        return
    if len(phases) > MAX_SCHEDULE_PHASES:
        raise ValueError(
            f"{where} has {len(phases):,} phases; a mixture schedule has at most "
            f"{MAX_SCHEDULE_PHASES} phases"
        )
    pieces = 1  # as the server counts them: the last phase's weights stay after its end
    for i, phase in enumerate(phases):
        if not isinstance(phase, Mapping):
            continue
        at = f"{where}[{i}]"
        steps = _int(phase.get("steps"))
        linear = phase.get("end_weights") is not None
        pieces += max(1, steps or DEFAULT_RAMP_PIECES) if linear else 1
        if steps is not None and steps > MAX_SCHEDULE_PIECES:
            raise ValueError(
                f"{at}.steps {steps:,} is beyond the bound: a mixture schedule makes at most "
                f"{MAX_SCHEDULE_PIECES:,} constant pieces in all (a linear phase its 'steps')"
            )
        if pieces > MAX_SCHEDULE_PIECES:
            raise ValueError(
                f"{where}: its phases up to [{i}] make {pieces:,} constant pieces (a linear "
                f"phase makes its 'steps'); a mixture schedule makes at most "
                f"{MAX_SCHEDULE_PIECES:,}"
            )
        until = _int(phase.get("until"))
        if until is not None and until > MAX_STEPS:
            raise ValueError(
                f"{at}.until {until:,} is beyond the bound on steps: at most {MAX_STEPS:,}"
            )
        tokens = _int(phase.get("until_tokens"))
        if tokens is not None and tokens > MAX_TOKENS:
            raise ValueError(
                f"{at}.until_tokens {tokens:,} is beyond the bound: at most {MAX_TOKENS:,} tokens"
            )
        if tokens is not None and per_step is not None and per_step > 0:
            step = -(-tokens // per_step)
            if step > MAX_STEPS:
                raise ValueError(
                    f"{at}.until_tokens {tokens:,} at {per_step:,} tokens a step ends at step "
                    f"{step:,}, beyond the bound on steps: at most {MAX_STEPS:,}"
                )


def check_plan_bounds(plan: Mapping[str, Any], *, what: str = "plan") -> None:
    """Raise ValueError naming the spot when a stored plan (a run's parameters, or a
    checkpoint's reader state holding them under ``plan``) is beyond a bound: its mixture
    schedule, its ``epoch_size``, its state's ``epoch``."""
    params: Mapping[str, Any] = plan
    where = what
    inner = plan.get("plan")
    if isinstance(inner, Mapping):
        epoch = _int(plan.get("epoch"))
        if epoch is not None and epoch > MAX_EPOCHS:
            raise ValueError(f"{what}.epoch {epoch:,} is beyond the bound: at most {MAX_EPOCHS:,}")
        params, where = inner, f"{what}.plan"
    size = _int(params.get("epoch_size"))
    if size is not None and size > MAX_EPOCH_SAMPLES:
        raise ValueError(
            f"{where}.epoch_size {size:,} is beyond the bound: at most {MAX_EPOCH_SAMPLES:,} "
            "samples"
        )
    if params.get("schedule") is not None:
        _check_schedule(params["schedule"], f"{where}.schedule")


def check_attempt_changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``changes`` unless it holds more than :data:`MAX_ATTEMPT_CHANGES_BYTES` of JSON in
    all (ValueError naming the bound; the count of entries is bounded by the field)."""
    size = len(json.dumps(changes, separators=(",", ":")))
    if size > MAX_ATTEMPT_CHANGES_BYTES:
        raise ValueError(
            f"{size:,} bytes of JSON; an attempt's changes hold at most "
            f"{MAX_ATTEMPT_CHANGES_BYTES:,} bytes in all (a change names the parameters "
            "that changed, with their old and new values)"
        )
    return changes


def _plan_within_bounds(value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    check_plan_bounds(value, what=info.field_name or "plan")
    return value


Step = Annotated[
    int, Field(ge=0, json_schema_extra={"maximum": MAX_STEPS}), AfterValidator(check_step)
]
"""A training step (global batches since the run's start), at most :data:`MAX_STEPS`."""
Epoch = Annotated[
    int, Field(ge=0, json_schema_extra={"maximum": MAX_EPOCHS}), AfterValidator(check_epoch)
]
"""An epoch number, at most :data:`MAX_EPOCHS`."""
SampleInEpoch = Annotated[
    int,
    Field(ge=0, json_schema_extra={"maximum": MAX_EPOCH_SAMPLES}),
    AfterValidator(check_sample),
]
"""Samples of an epoch consumed, at most :data:`MAX_EPOCH_SAMPLES`."""
BoundedPlan = Annotated[PlanObject, AfterValidator(_plan_within_bounds)]
"""A run's or a checkpoint's plan (:data:`PlanObject`) within :func:`check_plan_bounds`."""
AttemptChanges = Annotated[list[PlanObject], Field(max_length=MAX_ATTEMPT_CHANGES),
                           AfterValidator(check_attempt_changes)]  # fmt: skip
"""An attempt's recorded plan changes, within :func:`check_attempt_changes`."""
