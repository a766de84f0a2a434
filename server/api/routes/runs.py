"""``/v1/runs``: runs and their checkpoints (the data position at a training step)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response, status

from shardstream.server.api.deps import ERRORS, Cursor, Limit, Reader, RunId, SessionDep, Writer
from shardstream.server.data import attempts as attempts_data
from shardstream.server.data import checkpoints as checkpoints_data
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import mixture_history
from shardstream.server.data import runs as data
from shardstream.server.services import attempts, audit, checkpoints
from shardstream.server.services import runs as runs_service
from shardstream.server.services.checkpoints import CommitResult
from shardstream.wire import (
    DEFAULT_RANKS,
    MAX_RANKS,
    AttemptCreate,
    AttemptPublic,
    CheckpointCreate,
    CheckpointPublic,
    Page,
    RunCreate,
    RunInputStats,
    RunMixtureHistory,
    RunPublic,
    RunUpdate,
)

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=ERRORS)

Step = Annotated[int, Path(ge=0, le=2**62, description="training step")]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_run(body: RunCreate, session: SessionDep, who: Writer) -> RunPublic:
    """Register a run reading one or more published versions with weights; it belongs to
    the calling token (``owner``), which alone (with admins over all its datasets) may
    commit to it and change its status."""
    return runs_service.create(session, body, who=who)


@router.get("")
def list_runs(
    session: SessionDep, who: Reader, cursor: Cursor = None, limit: Limit = 100
) -> Page[RunPublic]:
    """Runs by id, a page at a time, each with its input verdict (``input``: whether it
    waits for data; one grouped query per page)."""
    return runs_service.page(session, cursor=cursor, limit=limit, who=who)


@router.get("/{run_id}")
def get_run(run_id: RunId, session: SessionDep, who: Reader) -> RunPublic:
    """One run (the token needs read access to all its datasets)."""
    return runs_service.get(session, run_id, who=who)


@router.patch("/{run_id}")
def update_run(run_id: RunId, body: RunUpdate, session: SessionDep, who: Writer) -> RunPublic:
    """Set a run's status (its owner, or an admin over all its datasets); a run that is no
    longer ``running`` stops protecting its datasets."""
    return runs_service.set_status(session, run_id, body.status, who=who)


@router.post(
    "/{run_id}/checkpoints",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": CheckpointPublic, "description": "same state already committed"}},
)
def commit_checkpoint(
    *,
    run_id: RunId,
    body: CheckpointCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    who: Writer,
) -> CheckpointPublic:
    """Commit the data position at a step: 201 new, 200 same state again, 409 otherwise;
    403 unless the caller owns the run or is an admin over all its datasets."""
    metrics = request.app.state.metrics
    checkpoint, result = checkpoints.commit(session, metrics, run_id, body, who=who)
    if result is CommitResult.unchanged:
        response.status_code = status.HTTP_200_OK
    return checkpoint


@router.get("/{run_id}/checkpoints")
def list_checkpoints(
    run_id: RunId, session: SessionDep, who: Reader, cursor: Cursor = None, limit: Limit = 100
) -> Page[CheckpointPublic]:
    """A run's checkpoints by step."""
    data.require_readable(session, who, run_id)
    return checkpoints_data.page(session, run_id, cursor=cursor, limit=limit)


@router.get("/{run_id}/checkpoints/latest")
def latest_checkpoint(run_id: RunId, session: SessionDep, who: Reader) -> CheckpointPublic:
    """The checkpoint with the highest step (404 when none was committed)."""
    data.require_readable(session, who, run_id)
    return checkpoints_data.latest(session, run_id)


@router.get("/{run_id}/checkpoints/{step}")
def get_checkpoint(run_id: RunId, step: Step, session: SessionDep, who: Reader) -> CheckpointPublic:
    """The checkpoint committed at ``step``."""
    data.require_readable(session, who, run_id)
    return checkpoints_data.at_step(session, run_id, step)


@router.post(
    "/{run_id}/attempts",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": AttemptPublic, "description": "this attempt was registered"}},
)
def register_attempt(
    *, run_id: RunId, body: AttemptCreate, response: Response, session: SessionDep, who: Writer
) -> AttemptPublic:
    """Register one start of the run (every rank sends the same ``key``: 201 for the first,
    200 for the others): its topology and the checkpoint it resumes. 409 when the resume
    point is no checkpoint of the run (naming the nearest steps), when the trainer's step
    and the loader's position disagree, when the loader reads other versions or global
    batches than the run, or when ranks of one start disagree (the attempt is then marked
    disputed: none of its commits is accepted)."""
    attempt, created = attempts.register(session, run_id, body, who=who)
    if not created:
        response.status_code = status.HTTP_200_OK
    return attempt


@router.get("/{run_id}/attempts")
def list_attempts(
    run_id: RunId, session: SessionDep, who: Reader, cursor: Cursor = None, limit: Limit = 100
) -> Page[AttemptPublic]:
    """The run's attempts (its ledger of starts) by number, a page at a time."""
    data.require_readable(session, who, run_id)
    return attempts_data.page(session, run_id, cursor=cursor, limit=limit)


@router.get("/{run_id}/audit")
def audit_run(run_id: RunId, session: SessionDep, who: Reader) -> dict[str, Any]:
    """Whether the run's effective history consumed every global batch of each epoch
    exactly once and in the plan's order (``ok``), with the failures, the attempts,
    rollbacks and plan changes, each list cut to its first entries beside its full count
    (see docs/server.md, "The audit")."""
    data.require_readable(session, who, run_id)
    return audit.audit(session, run_id)


RankLimit = Annotated[
    int, Query(ge=1, le=MAX_RANKS, description="ranks per answer (the slowest first)")
]


@router.get("/{run_id}/input-stats")
def input_stats(
    run_id: RunId,
    session: SessionDep,
    who: Reader,
    cursor: Cursor = None,
    limit: RankLimit = DEFAULT_RANKS,
) -> RunInputStats:
    """Is the run waiting for data? Its verdict, data-wait share and ranks per verdict over
    all its ranks, the ranks that never reported, and its ``limit`` slowest ranks (data-wait
    share, batch-ready latency, storage and cache figures, verdict), from their checkpoint
    commits; ``next_cursor`` pages through the rest, slowest first (see docs/training.md)."""
    data.require_readable(session, who, run_id)
    return input_stats_data.for_run(session, run_id, limit=limit, cursor=cursor)


@router.get("/{run_id}/mixture")
def mixture(run_id: RunId, session: SessionDep, who: Reader) -> RunMixtureHistory:
    """The run's mixture over training: per window of global steps (at most 64 finished
    ones, their width doubling as the run grows, plus the one it is in), the samples each
    source gave, their tokens where every source's samples have a fixed length, and the
    weights the run's schedule planned for the window (see docs/console.md). A run
    without a schedule answers ``scheduled: false`` and no windows."""
    data.require_readable(session, who, run_id)
    return mixture_history.for_run(session, run_id)
