"""Registering one start of a run in its ledger of attempts.

Every rank of a start registers the same key; the first creates the attempt, the others
find it. Ranks that disagree on where they resume dispute the attempt: the refusal is
kept (the attempt marked disputed, so none of its commits is accepted) while nothing
else of the refused registration is.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from shardstream.server.auth import Principal
from shardstream.server.data import attempts as attempts_data
from shardstream.server.data import runs as runs_data
from shardstream.wire import AttemptCreate, AttemptPublic


def register(
    session: Session, run_id: int, body: AttemptCreate, *, who: Principal
) -> tuple[AttemptPublic, bool]:
    """Register ``body`` as a start of run ``run_id`` for ``who``: the attempt and whether
    this call created it.

    403 for datasets outside ``who``'s or a run it may not write; 409 when the resume
    point is no checkpoint of the run, the trainer's step and the loader's position
    disagree, the loader reads other versions or global batches than the run, or ranks of
    one start disagree. A dispute's transaction is rolled back and only the dispute
    committed, then the 409 raised; otherwise committing is the caller's.
    """
    named = {"versions": body.versions, "changes": body.changes}
    runs_data.require_named_datasets(who, runs_data.named_versions(named))
    try:
        return attempts_data.register(session, run_id, body, who=who)
    except attempts_data.DisputedError as exc:
        session.rollback()  # the refused registration leaves nothing but the dispute
        attempts_data.mark_disputed(session, run_id, exc.number, str(exc))
        session.commit()
        raise
