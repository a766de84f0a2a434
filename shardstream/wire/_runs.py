"""Training runs and their checkpoints (a run's data position at a step)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import Field

from ._fields import MAX_INT, Name, PublicModel, StrictModel
from ._input_stats import InputStatsReport, RunInputSummary
from ._run_bounds import AttemptChanges, BoundedPlan, Epoch, SampleInEpoch, Step


class RunStatus(str, Enum):
    """A run's status, set by its owner."""

    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class RunSource(StrictModel):
    """One published version a run reads, with its mixture weight."""

    dataset: Name
    version: Annotated[int, Field(ge=1, le=MAX_INT)]
    weight: Annotated[float, Field(gt=0, le=1e12)] = 1.0


class RunCreate(StrictModel):
    """Register a training run reading one or more published versions."""

    name: Name | None = None
    sources: Annotated[list[RunSource], Field(min_length=1, max_length=256)]
    seed: Annotated[int, Field(ge=0, le=MAX_INT)] = 0
    global_batch_size: Annotated[int, Field(ge=1, le=MAX_INT)]
    plan: BoundedPlan = Field(default_factory=dict)


class RunUpdate(StrictModel):
    """Change a run's status."""

    status: RunStatus


class RunPublic(PublicModel):
    """A run as the server returns it.

    ``owner`` is the principal that created it (``token:<id>``, or ``admin`` for the
    bootstrap admin secret; None for runs created before runs had owners): only it, or an
    admin whose rights cover all the run's datasets, may commit to it or change it.
    ``created_by`` is that token's name, for people. ``input``: whether the run waits for
    data (from its ranks' commits; None from servers before input figures).
    """

    id: int
    name: str | None
    sources: list[RunSource]
    seed: int
    global_batch_size: int
    plan: dict[str, Any]
    status: RunStatus
    created_by: str
    owner: str | None = None
    created_at: datetime
    updated_at: datetime
    input: RunInputSummary | None = None


AttemptNumber = Annotated[int, Field(ge=1, le=2**31 - 1)]
VersionId = Annotated[str, Field(min_length=1, max_length=200)]
AttemptKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")]


class CheckpointCreate(StrictModel):
    """A run's data position at a training step; ``attempt``: the attempt committing it
    (the number the server gave at registration; None from clients before the ledger)."""

    step: Step
    epoch: Epoch
    sample_in_epoch: SampleInEpoch
    plan: BoundedPlan = Field(default_factory=dict)
    attempt: AttemptNumber | None = None
    stats: InputStatsReport | None = None
    """The committing rank's input figures since its previous commit (not part of the
    checkpoint: every rank sends its own with the same step)."""


class CheckpointPublic(PublicModel):
    """A committed checkpoint."""

    run_id: int
    step: int
    epoch: int
    sample_in_epoch: int
    plan: dict[str, Any]
    created_at: datetime
    attempt: int | None = None
    superseded_by: int | None = None


class ResumePoint(StrictModel):
    """Where an attempt's data starts: a position, and the trainer's step when it knows it
    (the step of the model checkpoint it restored)."""

    step: Step | None = None
    epoch: Epoch
    sample_in_epoch: SampleInEpoch


class AttemptCreate(StrictModel):
    """Register one start of a run (every rank of the job sends the same body).

    ``key`` is the same on every rank of one start of the job and differs between starts;
    ``resume`` is None for the run's first start; ``changes`` are the plan changes the
    resume accepted (``ReaderState.changes``). ``versions`` (the version ids the loader
    reads, ``name@N`` for the server's datasets) and ``global_batch_size`` are checked
    against the run's (None from clients before that check).
    """

    key: AttemptKey
    world_size: Annotated[int, Field(ge=1, le=2**31 - 1)]
    workers: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    resume: ResumePoint | None = None
    algorithm: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    fingerprint: Annotated[str, Field(max_length=64, pattern=r"^[0-9a-f]*$")] | None = None
    changes: AttemptChanges = Field(default_factory=list)
    versions: Annotated[list[VersionId], Field(max_length=256)] | None = None
    global_batch_size: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None


class AttemptPublic(PublicModel):
    """One start of a run, as the ledger holds it."""

    run_id: int
    number: int
    key: str
    world_size: int
    workers: int | None
    resumed_step: int | None
    resumed_attempt: int | None
    start_epoch: int
    start_sample: int
    rolled_back_from: int | None
    algorithm: int | None
    fingerprint: str | None
    changes: list[dict[str, Any]]
    created_by: str
    created_at: datetime
    disputed: str | None = None
    """Why its ranks disagreed on where they resume (none of its commits is accepted)."""
    refused: list[list[int]] | None = None
    """Its commits the server refused, ``[step, epoch, sample_in_epoch]`` each."""
