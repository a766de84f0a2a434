"""A run's input figures over all its ranks, kept as the ranks' commits arrive.

``/metrics`` exports every running run's figures summed over its ranks. Summing the
ranks' rows at each scrape costs a read of every rank of every run (seconds for a few
large jobs, and no one waits for a scrape); one row per run, updated in the transaction
of each rank's commit, makes a scrape read one row per run whatever the world sizes.

The row holds what cannot drift from the ranks' rows (:mod:`.input_stats`):

* sums: each rank's new window adds what it added to that rank's totals (nothing for a
  replayed step), saturating at the totals' bounds (:func:`~shardstream.wire.saturated`);
* the number of ranks per latest verdict: a rank's first window adds one to its
  verdict, a changed verdict moves it from the old one to the new;
* the largest world size any rank reported (a run resumed on fewer ranks keeps the
  rows of its former ranks, so that is what a maximum over the rows said, too).

One statement per commit, an upsert whose increments the database applies to the row as
it stands (PostgreSQL locks the row), so ranks committing at once never lose a window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, case, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from shardstream.server.models import RunInputTotalsRow, RunRow
from shardstream.wire import Verdict, saturated

SUMMED = (
    "data_wait_s",
    "step_s",
    "storage_bytes",
    "storage_requests",
    "throttled",
    "retries",
    "cache_hits",
    "cache_misses",
)
"""The ranks' totals a run's row sums (those ``/metrics`` exports)."""

RANKS_BY_VERDICT: dict[str, InstrumentedAttribute[int]] = {
    verdict.value: getattr(RunInputTotalsRow, f"ranks_{verdict.value}") for verdict in Verdict
}
"""The column counting a run's ranks whose latest verdict is each :class:`Verdict` (a new
verdict without its column fails here, at import)."""


def bound(name: str) -> float:
    """The most figure ``name``'s sum holds: where :func:`saturated` stops it."""
    return saturated(name, float(1 << 63))


def added(name: str, before: float, window: float) -> float:
    """What a window of ``window`` adds to a rank's total of ``before`` for figure ``name``
    (less near its bound; a stored total past it is held there first)."""
    held = saturated(name, max(before, 0))
    return max(min(window, bound(name) - held), 0)


def add_window(
    session: Session,
    run_id: int,
    *,
    world_size: int,
    verdict: str,
    was: str | None,
    sums: Mapping[str, float],
) -> None:
    """Count a rank's window in run ``run_id``'s row: ``sums`` (by :data:`SUMMED` name)
    added to its rank's totals, its ``verdict`` (``was``: the rank's verdict before, None
    for a rank's first window) and the ``world_size`` it reported."""
    table = RunInputTotalsRow
    first: dict[str, Any] = {name: sums.get(name, 0) for name in SUMMED}
    first.update({column.key: 0 for column in RANKS_BY_VERDICT.values()})
    first[RANKS_BY_VERDICT[verdict].key] = 1
    changes: dict[str, Any] = {
        name: _saturating_add(getattr(table, name), name, sums[name])
        for name in SUMMED
        if sums.get(name)
    }
    changes["world_size"] = case(
        (table.world_size < world_size, literal(world_size)), else_=table.world_size
    )
    if was != verdict:
        column = RANKS_BY_VERDICT[verdict]
        changes[column.key] = column + 1
        if was is not None:
            before = RANKS_BY_VERDICT.get(was, RANKS_BY_VERDICT[Verdict.UNKNOWN])
            changes[before.key] = before - 1
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).values(run_id=run_id, world_size=world_size, **first)
    session.execute(
        statement.on_conflict_do_update(index_elements=[table.run_id], set_=changes),
        execution_options={"synchronize_session": False},
    )


def _saturating_add(
    column: InstrumentedAttribute[Any], name: str, amount: float
) -> ColumnElement[Any]:
    # ``column + amount`` could pass a 64-bit column's range before any LEAST applied.
    limit = bound(name)
    return case((column > literal(limit - amount), literal(limit)), else_=column + amount)


def of_running_runs(session: Session, limit: int) -> Sequence[RunInputTotalsRow]:
    """The rows of the ``limit`` most recently updated running runs that have one (any
    rank reported), by run id: one query, one row per run."""
    recent = (
        select(RunRow.id)
        .where(RunRow.status == "running")
        .order_by(RunRow.updated_at.desc())
        .limit(limit)
        .subquery()
    )
    return session.scalars(
        select(RunInputTotalsRow)
        .where(RunInputTotalsRow.run_id.in_(select(recent.c.id)))
        .order_by(RunInputTotalsRow.run_id)
        # The upserts change rows behind the session's back: read them as stored.
        .execution_options(populate_existing=True)
    ).all()


def ranks_by_verdict(row: RunInputTotalsRow) -> dict[str, int]:
    """A run's ranks per latest verdict (each verdict, zeros included)."""
    return {verdict: int(getattr(row, column.key)) for verdict, column in RANKS_BY_VERDICT.items()}
