"""Training runs and their checkpoints (a run's data position at a step)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import Field

from ._fields import MAX_INT, Count, Name, PlanObject, PublicModel, StrictModel


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
    plan: PlanObject = Field(default_factory=dict)


class RunUpdate(StrictModel):
    """Change a run's status."""

    status: RunStatus


class RunPublic(PublicModel):
    """A run as the server returns it.

    ``owner`` is the principal that created it (``token:<id>``, or ``admin`` for the
    bootstrap admin secret; None for runs created before runs had owners): only it, or an
    admin whose rights cover all the run's datasets, may commit to it or change it.
    ``created_by`` is that token's name, for people.
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


class CheckpointCreate(StrictModel):
    """A run's data position at a training step."""

    step: Count
    epoch: Count
    sample_in_epoch: Count
    plan: PlanObject = Field(default_factory=dict)


class CheckpointPublic(PublicModel):
    """A committed checkpoint."""

    run_id: int
    step: int
    epoch: int
    sample_in_epoch: int
    plan: dict[str, Any]
    created_at: datetime
