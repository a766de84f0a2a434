"""Runs as every route answers them: with their input verdict (whether they wait for
data), the same on creation, reads, lists and status changes."""

from __future__ import annotations

from sqlalchemy.orm import Session

from shardstream.server.auth import Principal
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import runs as runs_data
from shardstream.wire import Page, RunCreate, RunPublic, RunStatus


def with_input(session: Session, run: RunPublic) -> RunPublic:
    """``run`` with its input verdict."""
    return run.model_copy(update={"input": input_stats_data.summaries(session, [run.id])[run.id]})


def create(session: Session, body: RunCreate, *, who: Principal) -> RunPublic:
    """Register a run owned by ``who`` (see :func:`.data.runs.create`)."""
    return with_input(session, runs_data.create(session, body, created_by=who))


def get(session: Session, run_id: int, *, who: Principal) -> RunPublic:
    """One run (403 unless ``who`` may read all its datasets)."""
    runs_data.require_readable(session, who, run_id)
    run = runs_data.to_public(runs_data.get(session, run_id), runs_data.sources(session, run_id))
    return with_input(session, run)


def set_status(session: Session, run_id: int, status: RunStatus, *, who: Principal) -> RunPublic:
    """Set a run's status (its owner, or an admin over all its datasets)."""
    return with_input(session, runs_data.set_status(session, run_id, status, who=who))


def page(session: Session, *, cursor: str | None, limit: int, who: Principal) -> Page[RunPublic]:
    """Runs ``who`` may read by id, a page at a time (one grouped verdict query a page)."""
    found = runs_data.page(session, cursor=cursor, limit=limit, allowed=who.datasets)
    inputs = input_stats_data.summaries(session, [r.id for r in found.items])
    items = [r.model_copy(update={"input": inputs[r.id]}) for r in found.items]
    return Page[RunPublic](items=items, next_cursor=found.next_cursor)
