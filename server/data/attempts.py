"""The consumption ledger: every start of a run (an *attempt*) and where it resumed.

Every rank of a job registers the same attempt (the same ``key``): the first request
creates it (the run row locked, so numbers are dense), the others find it by its key
without a lock. A request whose body differs from the stored attempt, while that attempt
has committed nothing, is another rank of the same start that disagrees on where it
resumes or on the order (mixed-up per-rank states): it is refused, and the attempt is
marked *disputed* (:func:`mark_disputed`), so that none of its commits is accepted
either: no rank of a start whose ranks disagree trains into the run's history.

A launcher reuses its ids when a job is started again by hand (``torchrun`` without
``--rdzv-id``: the same port, run id ``none``). A registration under the key of an
attempt that is disputed, has committed, or is no longer the run's newest is such a later
start: a new attempt under the same key (ranks join the newest attempt of a key).

A resume names the checkpoint it continues: the trainer's step when it knows it (the
step of the model checkpoint it restored), else the data position, which must be a
checkpoint's. A step without a checkpoint, or whose checkpoint is at another position
than the loader's, is refused (409) with the nearest steps that exist. The loader must
read the run's dataset versions in global batches of the run's size (409 naming the
field). Resuming below the run's latest step is a rollback: allowed, and applied when the
attempt first commits (:func:`apply_rollback`: its ranks agreed by then), not when it
registers (a stale rank registering first must not abandon the run's checkpoints): then
it is recorded (``rolled_back_from``), and the checkpoints above the resumed step are
marked superseded (they leave the run's history; the new attempt commits those steps
again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError
from shardstream.server.auth import Principal
from shardstream.server.models import CheckpointRow, RunAttemptRow, RunRow, utcnow
from shardstream.wire import AttemptCreate, AttemptPublic, Page

from . import ID_MAX, decode_cursor
from . import runs as runs_data
from .paging import bounded_page, json_size

NEAREST = 3
"""Existing steps listed on each side of a step that has no checkpoint."""

ATTEMPT_ROW_BYTES = 400
"""About what an attempt's answer costs besides its ``changes`` (its other fields)."""

MAX_REFUSED = 64
"""Refused commits kept per attempt (the first ones: the trainer learns of a refusal at
the commit, so a start rarely has more than one)."""

MAX_ATTEMPTS = 10_000
"""Attempts one run may have (each is one start of the job): bounds the ledger and the
audit of a run whose job restarts in a loop."""


def to_public(row: RunAttemptRow) -> AttemptPublic:
    """An attempt row as the API returns it."""
    return AttemptPublic.model_validate(row)


def _live(run_id: int) -> Any:
    return (CheckpointRow.run_id == run_id) & CheckpointRow.superseded_by.is_(None)


def nearest_steps(session: Session, run_id: int, step: int) -> list[int]:
    """Up to :data:`NEAREST` live checkpoint steps below ``step`` and as many above."""
    below = session.scalars(
        select(CheckpointRow.step)
        .where(_live(run_id), CheckpointRow.step < step)
        .order_by(CheckpointRow.step.desc())
        .limit(NEAREST)
    ).all()
    above = session.scalars(
        select(CheckpointRow.step)
        .where(_live(run_id), CheckpointRow.step > step)
        .order_by(CheckpointRow.step)
        .limit(NEAREST)
    ).all()
    return sorted([*below, *above])


def steps_text(steps: Sequence[int]) -> str:
    """``"steps 100, 200 and 300"``, or that there are none."""
    if not steps:
        return "no checkpoints"
    names = [str(s) for s in steps]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"step{'s' if len(steps) > 1 else ''} {listed}"


def _near(session: Session, run_id: int, step: int) -> str:
    return f"the nearest checkpoints are at {steps_text(nearest_steps(session, run_id, step))}"


def live_checkpoint(session: Session, run_id: int, step: int) -> CheckpointRow | None:
    """The checkpoint at ``step`` unless a rollback abandoned it."""
    row = session.get(CheckpointRow, (run_id, step))
    return None if row is None or row.superseded_by is not None else row


def _resume_checkpoint(session: Session, run: RunRow, body: AttemptCreate) -> CheckpointRow:
    """The checkpoint ``body.resume`` continues (409 naming the nearest steps otherwise)."""
    assert body.resume is not None
    point = body.resume
    where = f"epoch {point.epoch}, sample_in_epoch {point.sample_in_epoch}"
    if point.step is not None:
        row = live_checkpoint(session, run.id, point.step)
        if row is None:
            raise ConflictError(
                f"run {run.id} has no checkpoint at step {point.step} (the trainer's step): "
                f"{_near(session, run.id, point.step)}; restore the model from a step that "
                "has one, or resume the loader with that step",
                409,
            )
        if (row.epoch, row.sample_in_epoch) != (point.epoch, point.sample_in_epoch):
            at = session.scalars(
                select(CheckpointRow.step)
                .where(
                    _live(run.id),
                    CheckpointRow.epoch == point.epoch,
                    CheckpointRow.sample_in_epoch == point.sample_in_epoch,
                )
                .limit(1)
            ).first()
            whose = f" (step {at}'s position)" if at is not None else ""
            raise ConflictError(
                f"run {run.id}: the trainer is at step {point.step}, whose checkpoint is at "
                f"epoch {row.epoch}, sample_in_epoch {row.sample_in_epoch}, but the loader's "
                f"state is at {where}{whose}: the model and the data would not match; load "
                f"the loader state of step {point.step} (resume={point.step})",
                409,
            )
        return row
    row = session.scalars(
        select(CheckpointRow)
        .where(
            _live(run.id),
            CheckpointRow.epoch == point.epoch,
            CheckpointRow.sample_in_epoch == point.sample_in_epoch,
        )
        .order_by(CheckpointRow.step.desc())
        .limit(1)
    ).first()
    if row is None:
        latest = run.latest_step if run.latest_step is not None else 0
        raise ConflictError(
            f"run {run.id} has no checkpoint at the loader state's position ({where}): the "
            f"run's latest checkpoints are at "
            f"{steps_text(nearest_steps(session, run.id, latest + 1))}; resume from a state "
            "committed to this run (resume=STEP), or start a new run",
            409,
        )
    return row


def _same(row: RunAttemptRow, body: AttemptCreate) -> dict[str, tuple[Any, Any]]:
    """What differs between a stored attempt and another rank's registration of it."""
    resume = body.resume
    mine = {
        "world_size": body.world_size,
        "workers": body.workers,
        "position": None if resume is None else [resume.epoch, resume.sample_in_epoch],
        "algorithm": body.algorithm,
        "fingerprint": body.fingerprint,
        "changes": body.changes,
    }
    stored = {
        "world_size": row.world_size,
        "workers": row.workers,
        "position": None if row.resumed_step is None else [row.start_epoch, row.start_sample],
        "algorithm": row.algorithm,
        "fingerprint": row.fingerprint,
        "changes": row.changes,
    }
    return {k: (stored[k], mine[k]) for k in mine if stored[k] != mine[k]}


class DisputedError(ConflictError):
    """Ranks of one start disagree: the route marks attempt ``number`` disputed (in its own
    transaction, as the request's is rolled back) before answering 409."""

    def __init__(self, message: str, number: int) -> None:
        super().__init__(message, 409)
        self.number = number


def _check_run(run: RunRow, versions: list[str], body: AttemptCreate) -> None:
    """409 naming the field when the loader reads other versions, or in other global
    batches, than the run was created with (``versions``: the run's ``name@N``)."""
    if body.global_batch_size is not None and body.global_batch_size != run.global_batch_size:
        raise ConflictError(
            f"run {run.id} reads global batches of {run.global_batch_size} samples, but this "
            f"loader's global_batch_size is {body.global_batch_size}: build the dataset "
            f"with global_batch_size={run.global_batch_size}, or create a run for "
            f"{body.global_batch_size}",
            409,
        )
    # A local index.json has no name on the server (its version id is a digest): only
    # loaders that read the server's datasets by name are compared; the audit sees the rest.
    named = body.versions is not None and all("@" in v for v in body.versions)
    if named and body.versions != versions:
        raise ConflictError(
            f"run {run.id} reads {versions}, but this loader reads {body.versions} "
            "(versions): build the dataset from the run's versions (name@version, in "
            "the run's order), or create a run for these",
            409,
        )


def _is_later_start(session: Session, run: RunRow, row: RunAttemptRow, *, same: bool) -> bool:
    """Whether a registration under ``row``'s key (with the same body: ``same``) is a later
    start of the job (a launcher reusing its ids), not another rank of ``row``'s start."""
    if row.disputed is not None:
        return True
    newest = session.scalar(
        select(func.max(RunAttemptRow.number)).where(RunAttemptRow.run_id == run.id)
    )
    if newest != row.number:
        return True
    if same:  # nothing tells a rank from a start at the same point: one history either way
        return False
    latest = (
        None if run.latest_step is None else session.get(CheckpointRow, (run.id, run.latest_step))
    )
    return latest is not None and latest.attempt == row.number  # it has committed


def register(
    session: Session, run_id: int, body: AttemptCreate, *, who: Principal
) -> tuple[AttemptPublic, bool]:
    """Register (or join) the attempt ``body.key``; returns it and whether it is new."""
    existing = _by_key(session, run_id, body.key)
    if existing is not None and not _same(existing, body):
        run = runs_data.get(session, run_id)
        runs_data.require_writable(session, who, run)
        if not _is_later_start(session, run, existing, same=True):
            return to_public(existing), False  # another rank of a start already registered
    run = runs_data.get(session, run_id, lock=True)
    session.refresh(run, with_for_update=True)  # the row as locked, not as read above
    runs_data.require_writable(session, who, run)
    existing = _by_key(session, run_id, body.key)  # registered meanwhile?
    if existing is not None:
        differ = _same(existing, body)
        if _is_later_start(session, run, existing, same=not differ):
            existing = None
        elif differ:
            lines = "; ".join(
                f"{k}: attempt has {a!r}, this rank {b!r}" for k, (a, b) in differ.items()
            )
            raise DisputedError(
                f"run {run_id} attempt {existing.number} (key {body.key!r}) was registered "
                f"with another start than this rank's: {lines}; every rank of a job must "
                "resume from the same state (are per-rank states mixed up?); none of this "
                "start's commits will be accepted: restart every rank from one state (if "
                f"this is a new launch of the job, not a rank of attempt {existing.number}, "
                "give it its own key: set SHARDSTREAM_ATTEMPT, or the launcher's run id)",
                existing.number,
            )
        else:
            return to_public(existing), False
    _check_run(run, [f"{s.dataset}@{s.version}" for s in runs_data.sources(session, run_id)], body)
    count = session.scalar(
        select(func.count()).select_from(RunAttemptRow).where(RunAttemptRow.run_id == run_id)
    )
    if (count or 0) >= MAX_ATTEMPTS:
        raise ConflictError(
            f"run {run_id} already has {MAX_ATTEMPTS} attempts; start a new run", 409
        )
    resumed: CheckpointRow | None = None
    if body.resume is not None:
        resumed = _resume_checkpoint(session, run, body)
    elif run.latest_step is not None:
        raise ConflictError(
            f"run {run_id} already has checkpoints (the latest at step {run.latest_step}) and "
            "this start resumes none: a trainer that restored its model must resume the "
            f"loader at the model's step (resume=STEP; "
            f"{_near(session, run_id, run.latest_step + 1)}); to train from the start "
            "again, create a new run",
            409,
        )
    row = RunAttemptRow(
        run_id=run_id,
        number=(count or 0) + 1,
        key=body.key,
        world_size=body.world_size,
        workers=body.workers,
        resumed_step=None if resumed is None else resumed.step,
        resumed_attempt=None if resumed is None else resumed.attempt,
        start_epoch=0 if resumed is None else resumed.epoch,
        start_sample=0 if resumed is None else resumed.sample_in_epoch,
        rolled_back_from=None,  # set when its first commit applies the rollback
        algorithm=body.algorithm,
        fingerprint=body.fingerprint,
        changes=list(body.changes),
        created_by=who.name[:128],
        created_at=utcnow(),
    )
    session.add(row)
    run.updated_at = row.created_at
    session.flush()
    return to_public(row), True


def mark_disputed(session: Session, run_id: int, number: int, why: str) -> None:
    """Record that attempt ``number``'s ranks disagree (the first reason is kept)."""
    row = get(session, run_id, number)
    if row is not None and row.disputed is None:
        row.disputed = why[:2000]
        session.flush()


def record_refused(session: Session, run_id: int, number: int, point: list[int]) -> None:
    """Record a commit of attempt ``number`` the server refused (``[step, epoch,
    sample_in_epoch]``; the first :data:`MAX_REFUSED`)."""
    row = get(session, run_id, number)
    if (
        row is not None
        and len(row.refused or []) < MAX_REFUSED
        and point not in (row.refused or [])
    ):
        row.refused = [*(row.refused or []), point]
        session.flush()


def rollback_pending(session: Session, run: RunRow, attempt: RunAttemptRow) -> bool:
    """Whether ``attempt`` resumed below the run's latest step and has not committed yet
    (its first commit applies the rollback)."""
    if (
        attempt.resumed_step is None
        or attempt.rolled_back_from is not None
        or run.latest_step is None
        or run.latest_step <= attempt.resumed_step
    ):
        return False
    latest = session.get(CheckpointRow, (run.id, run.latest_step))
    return latest is None or latest.attempt != attempt.number


def apply_rollback(session: Session, run: RunRow, attempt: RunAttemptRow) -> None:
    """Abandon the checkpoints above ``attempt``'s resume point (run row locked)."""
    assert attempt.resumed_step is not None and run.latest_step is not None
    session.execute(
        update(CheckpointRow)
        .where(_live(run.id), CheckpointRow.step > attempt.resumed_step)
        .values(superseded_by=attempt.number)
        .execution_options(synchronize_session="fetch")
    )
    attempt.rolled_back_from = run.latest_step
    run.latest_step = attempt.resumed_step


def _by_key(session: Session, run_id: int, key: str) -> RunAttemptRow | None:
    """The newest attempt registered under ``key``."""
    return session.scalars(
        select(RunAttemptRow)
        .where(RunAttemptRow.run_id == run_id, RunAttemptRow.key == key)
        .order_by(RunAttemptRow.number.desc())
        .limit(1)
    ).first()


def get(session: Session, run_id: int, number: int) -> RunAttemptRow | None:
    """Attempt ``number`` of the run, if registered."""
    return session.scalars(
        select(RunAttemptRow).where(RunAttemptRow.run_id == run_id, RunAttemptRow.number == number)
    ).first()


def all_of(session: Session, run_id: int) -> list[RunAttemptRow]:
    """The run's attempts in order (at most :data:`MAX_ATTEMPTS`)."""
    return list(
        session.scalars(
            select(RunAttemptRow)
            .where(RunAttemptRow.run_id == run_id)
            .order_by(RunAttemptRow.number)
            .limit(MAX_ATTEMPTS)
        )
    )


def page(session: Session, run_id: int, *, cursor: str | None, limit: int) -> Page[AttemptPublic]:
    """A page of the run's attempts by number, bounded in bytes of ``changes`` as well as
    in rows (:func:`~.paging.bounded_page`: a run's ledger once answered 87 MiB at once)."""

    def fetch(after: int | None, n: int) -> Sequence[RunAttemptRow]:
        query = select(RunAttemptRow).where(RunAttemptRow.run_id == run_id)
        if after is not None:
            query = query.where(RunAttemptRow.number > after)
        return session.scalars(query.order_by(RunAttemptRow.number).limit(n)).all()

    rows, more = bounded_page(
        fetch,
        lambda r: r.number,
        lambda r: json_size(r.changes) + ATTEMPT_ROW_BYTES,
        after=decode_cursor(cursor, upper=ID_MAX),
        limit=limit,
    )
    items = [to_public(r) for r in rows]
    return Page[AttemptPublic](items=items, next_cursor=str(items[-1].number) if more else None)
