"""The console's runs: the list with each run's progress, and one run's page (progress
chart, mixture, input verdict, audit)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from shardstream.errors import APIError
from shardstream.server.api.deps import RunId, SessionDep
from shardstream.server.console import mixture, progress, site
from shardstream.server.console.mixture_chart import mixture_chart
from shardstream.server.console.site import User
from shardstream.server.data import checkpoints as checkpoints_data
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import mixture_history
from shardstream.server.data import runs as runs_data
from shardstream.server.models import utcnow
from shardstream.server.services import audit
from shardstream.wire import Scope

router = site.console_router()

CHART_POINTS = 500
"""The checkpoints a run's chart shows at most (its last ones)."""
AUDIT_ON_PAGE = 20_000
"""Checkpoints up to which the run page shows the audit (beyond: `shardstream runs audit`)."""
INPUT_RANKS = 16
"""The slowest ranks the run page lists (`shardstream runs show RUN --json` has them all)."""


@router.get("/runs", response_class=HTMLResponse)
async def runs(
    request: Request,
    who: User,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    def load() -> tuple[list[dict[str, Any]], str | None]:
        who.require(Scope.read)
        found = runs_data.page(session, cursor=after, limit=site.PAGE, allowed=who.datasets)
        ids = [r.id for r in found.items]
        rows = runs_data.rows_by_id(session, ids)
        sources = runs_data.sources_with_samples(session, ids)
        latest = checkpoints_data.newest_rows(session, ids)
        inputs = input_stats_data.summaries(session, ids)
        now = utcnow()
        shown = [
            {
                "run": run,
                "progress": progress.progress(
                    rows[run.id], latest.get(run.id), sources[run.id], now
                ),
                "input": inputs[run.id],
            }
            for run in found.items
        ]
        return shown, found.next_cursor

    try:
        shown, next_cursor = await run_in_threadpool(load)
    except APIError as exc:
        return site.error(request, who, exc)
    return site.page(request, "runs.html", who, runs=shown, next_cursor=next_cursor)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run(request: Request, who: User, session: SessionDep, run_id: RunId) -> HTMLResponse:
    def load() -> dict[str, Any]:
        who.require(Scope.read)
        runs_data.require_readable(session, who, run_id)
        row = runs_data.get(session, run_id)
        sources = runs_data.sources_with_samples(session, [run_id])[run_id]
        recent = checkpoints_data.recent_rows(session, run_id, CHART_POINTS)
        total = checkpoints_data.count(session, run_id)
        state = progress.progress(row, recent[-1] if recent else None, sources)
        pts = progress.points(recent, state.epoch_samples)
        mix = mixture.mixture_view(
            recent[-1].plan if recent else row.plan,
            [f"{s.dataset} v{s.version}" for s, _ in sources],
            state.epoch_samples,
            state.epoch or 0,
            state.sample_in_epoch or 0,
        )
        chart, legend = mixture_chart(mixture_history.for_run(session, run_id)) if mix else ("", [])
        # The audit reads every checkpoint once: on the page up to AUDIT_ON_PAGE of them.
        report = audit.audit(session, run_id) if total <= AUDIT_ON_PAGE else None
        return {
            "inputs": input_stats_data.for_run(session, run_id, limit=INPUT_RANKS),
            "audit": report,
            "run": runs_data.to_public(row, [s for s, _ in sources]),
            "progress": state,
            "mixture": mix,
            "mixture_chart": chart,
            "mixture_legend": legend,
            "chart": progress.chart_svg(pts),
            "points": pts[::-1][: site.PAGE],
            "checkpoints": total,
        }

    try:
        context = await run_in_threadpool(load)
    except APIError as exc:
        return site.error(request, who, exc)
    return site.page(request, "run.html", who, **context)
