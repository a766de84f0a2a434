"""Input figures per run and rank (is training waiting for data?), from checkpoint commits.

Each rank's commit carries its figures since its previous commit
(:class:`~shardstream.wire.InputStatsReport`, a fixed set of numbers). One row per run and
rank keeps the latest window, the totals, and the wait share of the last
:data:`~shardstream.wire.MAX_HISTORY` commits, so what the server stores is
bounded by the number of ranks, not by the length of the run. A commit retried at a step
the row already has is not counted twice. Totals saturate at their bounds
(:func:`~shardstream.wire.saturated`) and stored figures are held to them
when read, so no sum ever makes a run's views fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from shardstream.errors import RequestValidationError
from shardstream.server.models import RankInputStatsRow, utcnow
from shardstream.wire import (
    COUNTS,
    DEFAULT_RANKS,
    INPUT_BOUND,
    MAX_HISTORY,
    MAX_INT,
    MAX_MISSING_LISTED,
    MAX_WORLD_SIZE,
    SECONDS,
    InputFigures,
    InputStatsReport,
    RankInputStats,
    RunInputStats,
    RunInputSummary,
    Verdict,
    saturated,
)

from . import run_input_totals
from . import runs as runs_data

# Fields a window adds to the totals (the rest describe the latest window only).
_SUMMED = (*COUNTS, *SECONDS)


def share(report: dict[str, Any]) -> float:
    """Data wait over data wait plus step (0.0 before any batch)."""
    total = float(report["data_wait_s"]) + float(report["step_s"])
    return float(report["data_wait_s"]) / total if total > 0 else 0.0


def record(session: Session, run_id: int, step: int, report: InputStatsReport) -> None:
    """Add a rank's window (sent with its commit at ``step``) to the run's figures."""
    latest = report.model_dump(mode="json")
    row = session.get(RankInputStatsRow, (run_id, report.rank))
    if row is None:
        session.add(
            RankInputStatsRow(
                run_id=run_id,
                rank=report.rank,
                world_size=report.world_size,
                step=step,
                verdict=report.verdict,
                wait_share=share(latest),
                latest=latest,
                total=latest,
                history=[[step, round(share(latest), 4)]],
                updated_at=utcnow(),
            )
        )
        sums = {name: latest[name] for name in run_input_totals.SUMMED}
        _count_in_run(session, run_id, report, None, sums)
        return
    if step <= row.step:
        return  # a retried or replayed commit: this window is counted already
    total = dict(row.total)
    sums = {
        name: run_input_totals.added(name, total.get(name, 0), latest[name])
        for name in run_input_totals.SUMMED
    }
    _count_in_run(session, run_id, report, row.verdict, sums)
    for name in _SUMMED:
        total[name] = saturated(name, total.get(name, 0) + latest[name])
    counts = total.get("latency_counts") or [0] * len(report.latency_counts)
    total["latency_counts"] = [
        min(a + b, MAX_INT) for a, b in zip(counts, report.latency_counts, strict=True)
    ]
    for name in ("world_size", "ring_occupancy", "workers", "verdict"):
        total[name] = latest[name]
    row.world_size, row.step, row.verdict = report.world_size, step, report.verdict
    row.wait_share, row.latest, row.total = share(latest), latest, total
    row.history = [*row.history, [step, round(share(latest), 4)]][-MAX_HISTORY:]
    row.updated_at = utcnow()


def _count_in_run(
    session: Session,
    run_id: int,
    report: InputStatsReport,
    was: str | None,
    sums: dict[str, float],
) -> None:
    """The window in the run's figures over all ranks (what ``/metrics`` reads)."""
    run_input_totals.add_window(
        session, run_id, world_size=report.world_size, verdict=report.verdict, was=was, sums=sums
    )


def _public(row: RankInputStatsRow) -> RankInputStats:
    return RankInputStats(
        rank=row.rank,
        world_size=row.world_size,
        step=row.step,
        verdict=row.verdict,
        wait_share=row.wait_share,
        latest=_figures(row.latest),
        total=_figures(row.total),
        history=[(int(s), float(v)) for s, v in row.history],
        updated_at=row.updated_at,
    )


def _figures(stored: Mapping[str, Any]) -> InputFigures:
    """Stored figures, held to their bounds (rows summed before totals saturated)."""
    held = dict(stored)
    for name in _SUMMED:
        if isinstance(held.get(name), int | float):
            held[name] = saturated(name, max(held[name], 0))
    counts = held.get("latency_counts")
    if isinstance(counts, list):
        held["latency_counts"] = [min(max(int(n), 0), MAX_INT) for n in counts]
    return InputFigures.model_validate(held)


def verdict_of(counts: Mapping[str, int]) -> str:
    """A run's verdict from the number of ranks per verdict: input-bound if any rank is
    (the more common cause among those ranks, ``io_bound`` on a tie), else not input-bound
    once any rank knows, else unknown."""
    io, cpu = counts.get(Verdict.IO_BOUND, 0), counts.get(Verdict.CPU_BOUND, 0)
    if io or cpu:
        return Verdict.IO_BOUND if io >= cpu else Verdict.CPU_BOUND
    return Verdict.NOT_INPUT_BOUND if counts.get(Verdict.NOT_INPUT_BOUND, 0) else Verdict.UNKNOWN


def summaries(session: Session, run_ids: Sequence[int]) -> dict[int, RunInputSummary]:
    """Each run's verdict and rank counts (for lists of runs), in one grouped query over
    the stored verdicts whatever the number of runs and ranks; a run with no rank
    reporting has verdict ``unknown``."""
    found: dict[int, list[tuple[str, int, int, float]]] = {i: [] for i in run_ids}
    if run_ids:
        rows = session.execute(
            select(
                RankInputStatsRow.run_id,
                RankInputStatsRow.verdict,
                func.count(),
                func.max(RankInputStatsRow.world_size),
                func.max(RankInputStatsRow.wait_share),
            )
            .where(RankInputStatsRow.run_id.in_(list(run_ids)))
            .group_by(RankInputStatsRow.run_id, RankInputStatsRow.verdict)
        ).all()
        for run_id, verdict, n, world, worst in rows:
            found[run_id].append((verdict, int(n), int(world), float(worst)))
    out = {}
    for run_id, groups in found.items():
        counts = {verdict: n for verdict, n, _, _ in groups}
        out[run_id] = RunInputSummary(
            verdict=verdict_of(counts),
            ranks_reporting=sum(counts.values()),
            ranks_input_bound=sum(counts.get(v, 0) for v in INPUT_BOUND),
            world_size=max((g[2] for g in groups), default=None),
            max_wait_share=max((g[3] for g in groups), default=None),
        )
    return out


def for_run(
    session: Session, run_id: int, *, limit: int = DEFAULT_RANKS, cursor: str | None = None
) -> RunInputStats:
    """A run's figures: its ``limit`` slowest ranks (after ``cursor``), the figures over
    all its ranks and the ranks that never reported.

    The answer is bounded by ``limit``, not by the world size: the run's verdict, wait
    share and counts come from one grouped query (the totals' wait and step summed in the
    database), and only the page's rows are read whole.
    """
    runs_data.get(session, run_id)
    after = _decode_cursor(cursor)
    mine = RankInputStatsRow.run_id == run_id
    groups = session.execute(
        select(
            RankInputStatsRow.verdict,
            func.count(),
            func.max(RankInputStatsRow.world_size),
            func.sum(RankInputStatsRow.total["data_wait_s"].as_float()),
            func.sum(RankInputStatsRow.total["step_s"].as_float()),
        )
        .where(mine)
        .group_by(RankInputStatsRow.verdict)
    ).all()
    counts = {verdict: int(n) for verdict, n, _, _, _ in groups}
    world = max((int(g[2]) for g in groups), default=None)
    wait = sum(float(g[3] or 0) for g in groups)
    step = sum(float(g[4] or 0) for g in groups)
    missing: list[int] = []
    missing_count = 0
    if world is not None:
        present = set(
            session.scalars(
                select(RankInputStatsRow.rank).where(mine, RankInputStatsRow.rank < world)
            )
        )
        missing_count = world - len(present)
        for rank in range(world):
            if len(missing) >= MAX_MISSING_LISTED:
                break
            if rank not in present:
                missing.append(rank)
    query = select(RankInputStatsRow).where(mine)
    if after is not None:
        share_after, rank_after = after
        query = query.where(
            or_(
                RankInputStatsRow.wait_share < share_after,
                and_(
                    RankInputStatsRow.wait_share == share_after,
                    RankInputStatsRow.rank > rank_after,
                ),
            )
        )
    rows = session.scalars(
        query.order_by(RankInputStatsRow.wait_share.desc(), RankInputStatsRow.rank).limit(limit + 1)
    ).all()
    page, more = rows[:limit], len(rows) > limit
    return RunInputStats(
        run_id=run_id,
        world_size=world,
        verdict=verdict_of(counts),
        wait_share=wait / (wait + step) if groups and wait + step > 0 else None,
        ranks=[_public(r) for r in page],
        missing=missing,
        missing_count=missing_count,
        ranks_reporting=sum(counts.values()),
        verdict_counts=counts,
        next_cursor=f"{page[-1].wait_share!r}/{page[-1].rank}" if more else None,
    )


def _decode_cursor(cursor: str | None) -> tuple[float, int] | None:
    """``next_cursor`` of a previous page: the last rank's wait share and rank (422 if it
    is not one)."""
    if not cursor:
        return None
    share_text, _, rank_text = cursor.partition("/")
    try:
        share_after, rank_after = float(share_text), int(rank_text)
    except ValueError:
        share_after, rank_after = -1.0, -1
    if not (0.0 <= share_after <= 1.0 and 0 <= rank_after < MAX_WORLD_SIZE):
        raise RequestValidationError(
            f"query.cursor: {cursor!r} is not a cursor returned by this endpoint", 422
        )
    return share_after, rank_after


@dataclass(frozen=True)
class RunAggregate:
    """One running run's figures summed over its ranks (for ``/metrics``)."""

    run_id: int
    ranks: int
    world_size: int
    input_bound_ranks: int
    data_wait_s: float
    step_s: float
    storage_bytes: int
    storage_requests: int
    throttled: int
    retries: int
    cache_hits: int
    cache_misses: int
    verdict: str


def running_aggregates(session: Session, limit: int) -> list[RunAggregate]:
    """Per running run (at most ``limit``, the most recently updated), its figures over
    its ranks: one row per run (:mod:`.run_input_totals`), whatever the world sizes, and
    ``/metrics`` labels by run only, so its series stay bounded too."""
    out = []
    for row in run_input_totals.of_running_runs(session, limit):
        counts = run_input_totals.ranks_by_verdict(row)
        out.append(
            RunAggregate(
                run_id=row.run_id,
                ranks=sum(counts.values()),
                world_size=row.world_size,
                input_bound_ranks=sum(counts[v] for v in INPUT_BOUND),
                data_wait_s=float(row.data_wait_s),
                step_s=float(row.step_s),
                storage_bytes=int(row.storage_bytes),
                storage_requests=int(row.storage_requests),
                throttled=int(row.throttled),
                retries=int(row.retries),
                cache_hits=int(row.cache_hits),
                cache_misses=int(row.cache_misses),
                verdict=verdict_of(counts),
            )
        )
    return out
