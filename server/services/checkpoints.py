"""Committing a run's data position at a training step.

One commit writes up to three things and counts one: the checkpoint itself (monotonic,
idempotent, checked against the run's ledger of attempts: :mod:`.data.checkpoints`),
the run's mixture windows when the position is new, and the committing rank's input
figures (replays of a step included: every rank reports its own). A refused commit
leaves nothing of itself but the record of the refusal, which the audit reads.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from shardstream.errors import ConflictError
from shardstream.server.auth import Principal
from shardstream.server.data import checkpoints as checkpoints_data
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import mixture_history
from shardstream.server.data import runs as runs_data
from shardstream.server.data.checkpoints import CommitResult
from shardstream.server.metrics import ServerMetrics
from shardstream.wire import CheckpointCreate, CheckpointPublic

__all__ = ["CommitResult", "commit"]


def commit(
    session: Session,
    metrics: ServerMetrics,
    run_id: int,
    body: CheckpointCreate,
    *,
    who: Principal,
) -> tuple[CheckpointPublic, CommitResult]:
    """Commit ``body`` to run ``run_id`` for ``who``: the checkpoint and what the commit
    did (``created``, or ``unchanged`` for the same state again).

    403 for datasets outside ``who``'s or a run it may not write, 409 for a state that
    conflicts with the run's checkpoints or attempts. The accepted commit's writes are
    left to the caller's transaction (``session`` is committed when the request ends); a
    refused one's transaction is rolled back and only its refusal committed, then the
    409 raised.
    """
    runs_data.require_named_datasets(who, runs_data.named_versions(body.plan))
    counted = metrics.checkpoint_commits
    try:
        checkpoint, result = checkpoints_data.commit(session, run_id, body, who=who)
    except ConflictError:
        counted.labels("conflict").inc()
        session.rollback()  # nothing of the refused commit, but the refusal, is kept
        checkpoints_data.record_refused(session, run_id, body)
        session.commit()
        raise
    counted.labels(result.value).inc()
    if result is CommitResult.created:  # a new position: its windows
        mixture_history.record(session, run_id, body.epoch, body.sample_in_epoch, body.plan)
    if body.stats is not None:  # every rank's own figures, replays of the step included
        input_stats_data.record(session, run_id, body.step, body.stats)
    return checkpoint, result
