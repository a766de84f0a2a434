"""Checkpoint queries: monotonic, idempotent commits of a run's data position."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError, NotFoundError
from shardstream.server.auth import Principal
from shardstream.server.models import CheckpointRow, RunAttemptRow, utcnow
from shardstream.wire import CheckpointCreate, CheckpointPublic, Page

from . import attempts as attempts_data
from . import decode_cursor
from . import runs as runs_data
from .paging import bounded_page, json_size


class CommitResult(str, Enum):
    """What a commit did (also the metric label)."""

    created = "created"
    unchanged = "unchanged"


def to_public(row: CheckpointRow) -> CheckpointPublic:
    """A checkpoint row as the API returns it."""
    return CheckpointPublic.model_validate(row)


PROCESS_KEYS = frozenset({"session"})
"""Plan keys that say which process committed (each rank is one), not where the data
stands: a replay by another rank with another session id is the same state."""


def _state(plan: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in plan.items() if k not in PROCESS_KEYS}


def _same_state(row: CheckpointRow, body: CheckpointCreate) -> bool:
    return (row.epoch, row.sample_in_epoch, _state(row.plan)) == (
        body.epoch,
        body.sample_in_epoch,
        _state(body.plan),
    )


def _check_attempt(session: Session, run_id: int, body: CheckpointCreate) -> RunAttemptRow:
    """``body.attempt``'s row; 409 unless it is registered, its ranks agree, it is the run's
    newest attempt, and it resumed before ``body.step``."""
    assert body.attempt is not None
    attempt = attempts_data.get(session, run_id, body.attempt)
    if attempt is None:
        raise ConflictError(
            f"run {run_id} has no attempt {body.attempt}: register the attempt before "
            "committing (the client does when its loader starts)",
            409,
        )
    if attempt.disputed is not None:
        raise ConflictError(
            f"run {run_id} attempt {body.attempt}: its ranks disagree on where they resume, "
            f"so none of its commits is accepted ({attempt.disputed})",
            409,
        )
    newest = session.scalar(
        select(func.max(RunAttemptRow.number)).where(RunAttemptRow.run_id == run_id)
    )
    if newest is not None and newest > body.attempt:
        raise ConflictError(
            f"run {run_id} attempt {body.attempt} was followed by attempt {newest} (a "
            "later start of the job); an earlier start's processes cannot commit to the "
            "run any more (is an old job still running?)",
            409,
        )
    if attempt.resumed_step is not None and body.step <= attempt.resumed_step:
        raise ConflictError(
            f"run {run_id} attempt {body.attempt} resumed the data at step "
            f"{attempt.resumed_step}; step {body.step} is not after it: the trainer's "
            "step does not match the loader's position (resume the loader at the step "
            "of the model checkpoint the trainer restored)",
            409,
        )
    return attempt


def _rate(session: Session, run_id: int, attempt: RunAttemptRow) -> int | None:
    """Samples per training step of the history ``attempt`` resumed, from its resume
    checkpoint and the live one before it in the same epoch (or, in epoch 0, from the
    run's start); None when they do not tell."""
    assert attempt.resumed_step is not None
    before = session.scalars(
        select(CheckpointRow)
        .where(
            CheckpointRow.run_id == run_id,
            CheckpointRow.superseded_by.is_(None),
            CheckpointRow.step < attempt.resumed_step,
            CheckpointRow.epoch == attempt.start_epoch,
        )
        .order_by(CheckpointRow.step.desc())
        .limit(1)
    ).first()
    if before is not None:
        samples, steps = (
            attempt.start_sample - before.sample_in_epoch,
            attempt.resumed_step - before.step,
        )
    elif attempt.start_epoch == 0:
        samples, steps = attempt.start_sample, attempt.resumed_step
    else:
        return None
    return samples // steps if steps > 0 and samples > 0 and samples % steps == 0 else None


def _check_pace(
    session: Session, run_id: int, attempt: RunAttemptRow, body: CheckpointCreate
) -> None:
    """409 when the data advanced since the attempt's resume point by another number of
    samples than its steps make at the run's rate (a model restored at one step beside a
    loader at another): the audit's own finding, at the commit that is wrong. Within the
    epoch the attempt resumed in (later epochs are left to the audit, which recomputes
    epoch sizes)."""
    if attempt.resumed_step is None or body.epoch != attempt.start_epoch:
        return
    rate = _rate(session, run_id, attempt)
    if rate is None:
        return
    got = body.sample_in_epoch - attempt.start_sample
    expected = rate * (body.step - attempt.resumed_step)
    if got != expected:
        raise ConflictError(
            f"run {run_id}: steps {attempt.resumed_step} -> {body.step} (attempt "
            f"{attempt.number} resumed): the data advanced {got} samples where the run's "
            f"{rate} per step make {expected}: "
            + ("batches skipped" if got > expected else "batches read again")
            + " against the model's steps (a model step restored without its loader "
            "state?); restore the model and the loader from one step (resume=STEP)",
            409,
        )


def commit(
    session: Session, run_id: int, body: CheckpointCreate, *, who: Principal
) -> tuple[CheckpointPublic, CommitResult]:
    """Commit ``body`` at its step.

    A step's state never changes, so a replay (every rank of a job commits the same step)
    is answered from the stored row without a lock. A new step locks the run row
    (PostgreSQL ``FOR UPDATE``) so concurrent commits of one run are serialized.
    Re-committing a step with the same state returns it unchanged; with a different
    state, or a step below the latest, is a 409. Only the run's owner, or an admin over
    all its datasets, may commit (403), replays included.

    With ``attempt`` (the ledger, :mod:`.attempts`), the commit is tied to that attempt,
    which is checked first, replays included (an old job still running behind its
    restart is refused even where its state equals the stored one): it must be
    registered, undisputed and the run's newest, its step must come after the step the
    attempt resumed from, and its position must have advanced from there at the run's
    rate. The attempt's first commit applies its rollback (:func:`.attempts.apply_rollback`);
    a step a rollback abandoned (``superseded_by``) is replaced by the new attempt's commit.
    """
    run = runs_data.get(session, run_id)
    runs_data.require_writable(session, who, run)
    attempt = None if body.attempt is None else _check_attempt(session, run_id, body)
    existing = session.get(CheckpointRow, (run_id, body.step))
    pending = attempt is not None and attempts_data.rollback_pending(session, run, attempt)
    live = existing is not None and existing.superseded_by is None
    if live and not pending and existing is not None and _same_state(existing, body):
        return to_public(existing), CommitResult.unchanged
    session.refresh(run, with_for_update=True)  # serialize the run's new steps
    if body.attempt is not None:
        attempt = _check_attempt(session, run_id, body)  # again, under the lock
        if attempts_data.rollback_pending(session, run, attempt):
            attempts_data.apply_rollback(session, run, attempt)
        _check_pace(session, run_id, attempt, body)
    existing = session.get(CheckpointRow, (run_id, body.step), populate_existing=True)
    if existing is not None and existing.superseded_by is None:
        if _same_state(existing, body):
            return to_public(existing), CommitResult.unchanged
        raise ConflictError(
            f"run {run_id} already has a checkpoint at step {body.step} with another state "
            f"(epoch {existing.epoch}, sample_in_epoch {existing.sample_in_epoch}); a step's "
            "state cannot change",
            409,
        )
    if run.latest_step is not None and body.step < run.latest_step:
        raise ConflictError(
            f"step {body.step} is lower than run {run_id}'s latest committed step "
            f"{run.latest_step}; steps must increase (resume from step {run.latest_step}, "
            "roll back by resuming from an earlier checkpoint, or start a new run)",
            409,
        )
    now = utcnow()
    if existing is not None:  # abandoned by a rollback: this attempt's commit replaces it
        existing.epoch, existing.sample_in_epoch = body.epoch, body.sample_in_epoch
        existing.plan, existing.created_at = body.plan, now
        existing.attempt, existing.superseded_by = body.attempt, None
        row = existing
    else:
        row = CheckpointRow(
            run_id=run_id,
            step=body.step,
            epoch=body.epoch,
            sample_in_epoch=body.sample_in_epoch,
            plan=body.plan,
            created_at=now,
            attempt=body.attempt,
        )
        session.add(row)
    run.latest_step = body.step
    run.updated_at = now
    session.flush()
    return to_public(row), CommitResult.created


def record_refused(session: Session, run_id: int, body: CheckpointCreate) -> None:
    """Keep a refused commit in its attempt's ledger (call after rolling back the refused
    request's transaction): a trainer may have saved its model at that step all the same,
    and a later start resuming there is flagged by the audit."""
    if body.attempt is not None:
        point = [body.step, body.epoch, body.sample_in_epoch]
        attempts_data.record_refused(session, run_id, body.attempt, point)


def at_step(session: Session, run_id: int, step: int) -> CheckpointPublic:
    """The checkpoint at ``step``, or 404 naming the nearest steps that have one (a
    checkpoint a rollback abandoned is gone from the run's history: 404 too)."""
    runs_data.get(session, run_id)
    row = attempts_data.live_checkpoint(session, run_id, step)
    if row is None:
        near = attempts_data.steps_text(attempts_data.nearest_steps(session, run_id, step))
        gone = session.get(CheckpointRow, (run_id, step))
        why = f" (abandoned by attempt {gone.superseded_by}'s rollback)" if gone is not None else ""
        raise NotFoundError(
            f"run {run_id} has no checkpoint at step {step}{why}; the nearest checkpoints "
            f"are at {near}",
            404,
        )
    return to_public(row)


def latest(session: Session, run_id: int) -> CheckpointPublic:
    """The checkpoint with the highest step, or 404 when none was committed."""
    runs_data.get(session, run_id)
    row = session.scalars(
        select(CheckpointRow)
        .where(CheckpointRow.run_id == run_id, CheckpointRow.superseded_by.is_(None))
        .order_by(CheckpointRow.step.desc())
        .limit(1)
    ).first()
    if row is None:
        raise NotFoundError(f"run {run_id} has no checkpoints yet", 404)
    return to_public(row)


def newest_rows(session: Session, run_ids: Sequence[int]) -> dict[int, CheckpointRow]:
    """Each run's checkpoint row with the highest step, by run id (runs without any are
    left out): one grouped query for a page of runs. Every committed row counts, one a
    rollback superseded too: it is where the run's data stood last."""
    if not run_ids:
        return {}
    last = (
        select(CheckpointRow.run_id, func.max(CheckpointRow.step).label("step"))
        .where(CheckpointRow.run_id.in_(run_ids))
        .group_by(CheckpointRow.run_id)
        .subquery()
    )
    rows = session.scalars(
        select(CheckpointRow).join(
            last, (CheckpointRow.run_id == last.c.run_id) & (CheckpointRow.step == last.c.step)
        )
    ).all()
    return {r.run_id: r for r in rows}


def recent_rows(session: Session, run_id: int, limit: int) -> list[CheckpointRow]:
    """The run's last ``limit`` checkpoint rows (superseded ones too), oldest first."""
    rows = session.scalars(
        select(CheckpointRow)
        .where(CheckpointRow.run_id == run_id)
        .order_by(CheckpointRow.step.desc())
        .limit(limit)
    )
    return list(rows)[::-1]


def count(session: Session, run_id: int) -> int:
    """How many checkpoint rows the run has (superseded ones too)."""
    total = session.scalar(
        select(func.count()).select_from(CheckpointRow).where(CheckpointRow.run_id == run_id)
    )
    return int(total or 0)


def page(
    session: Session, run_id: int, *, cursor: str | None, limit: int
) -> Page[CheckpointPublic]:
    """A page of a run's checkpoints by step, bounded in plan bytes as well as rows
    (:func:`~.paging.bounded_page`)."""
    runs_data.get(session, run_id)

    def fetch(after: int | None, n: int) -> Sequence[CheckpointRow]:
        query = select(CheckpointRow).where(CheckpointRow.run_id == run_id)
        if after is not None:
            query = query.where(CheckpointRow.step > after)
        return session.scalars(query.order_by(CheckpointRow.step).limit(n)).all()

    rows, more = bounded_page(
        fetch,
        lambda r: r.step,
        lambda r: json_size(r.plan),
        after=decode_cursor(cursor),
        limit=limit,
    )
    items = [to_public(r) for r in rows]
    nxt = str(items[-1].step) if more else None
    return Page[CheckpointPublic](items=items, next_cursor=nxt)
