"""The console's pages: sign-in, datasets -> versions -> shards, runs, tokens.

Each page resolves the session cookie to its token (:mod:`.session_store`) and reads through the
same data functions, with the same rights checks, as the JSON API. Pages are bounded like
API pages: lists are paged (at most :data:`PAGE` rows), a run's chart shows its last
:data:`CHART_POINTS` checkpoints.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import asc, desc, func, select
from sqlalchemy.orm import Session

from shardstream.errors import APIError, AuthenticationError
from shardstream.server.api.deps import RunId, SessionDep, authenticate, principal_of
from shardstream.server.auth import Principal, UnknownTokenError
from shardstream.server.budget import SIGN_IN_S, TokenAccounts, principal_key
from shardstream.server.console import display, mixture, progress, session_store
from shardstream.server.console.input_view import sparkline
from shardstream.server.console.mixture_chart import mixture_chart
from shardstream.server.console.session import (
    PREFIX,
    check_csrf,
    check_same_site,
    clear_session,
    csrf_token,
    read_form,
    session_id_of,
    set_session,
    who_label,
)
from shardstream.server.data import audit_answer, mixture_history
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import runs as runs_data
from shardstream.server.data import tokens as tokens_data
from shardstream.server.data import versions as versions_data
from shardstream.server.models import (
    CheckpointRow,
    RunRow,
    RunSourceRow,
    ShardRow,
    VersionRow,
    utcnow,
)
from shardstream.wire import Scope, TokenCreate

PAGE = 100
CHART_POINTS = 500
SHARD_SORTS = {"idx": ShardRow.idx, "samples": ShardRow.samples, "bytes": ShardRow.raw_bytes}

router = APIRouter(prefix=PREFIX, include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))
templates.env.filters.update(
    size=display.size, when=display.when, age=display.age, quote=lambda s: quote(str(s), safe="")
)
templates.env.filters["sparkline"] = sparkline


class _SignInError(Exception):
    """No valid session: the page answers with a redirect to the sign-in form."""


async def signed_in(request: Request) -> Principal:
    """The session's token (redirects to sign-in when there is none or it has ended)."""
    if session_id_of(request) is None:
        raise _SignInError
    try:
        return await authenticate(request)
    except AuthenticationError:
        raise _SignInError from None


User = Annotated[Principal, Depends(signed_in, scope="function")]


def _page(
    request: Request, name: str, who: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    session_id = session_id_of(request) if who is not None else None
    base = {
        "who": who,
        "who_label": who_label(who) if who else "",
        "is_admin": who is not None and who.scope is Scope.admin,
        "csrf": csrf_token(session_id) if session_id else "",
        "now": utcnow(),
    }
    return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)


def _error(request: Request, who: Principal | None, exc: APIError) -> HTMLResponse:
    status = exc.status or 500
    return _page(request, "error.html", who, status=status, status_code=status, message=str(exc))


def _sign_in_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)


def handle_sign_in(request: Request, exc: Exception) -> Response:
    """The app's handler for :class:`_SignInError` (registered by :func:`install`)."""
    response = _sign_in_redirect(request)
    if session_id_of(request) is not None:
        clear_session(response, request)  # an ended session: drop the cookie
    return response


def install(app: Any) -> None:
    """Add the console to ``app``: its routes and its sign-in redirect."""
    app.include_router(router)
    app.add_exception_handler(_SignInError, handle_sign_in)


# -- sign-in ---------------------------------------------------------------------------


def _safe_next(target: str | None) -> str:
    """Only console paths are followed after sign-in (no open redirect)."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//"):
        return target
    return f"{PREFIX}/datasets"


@router.get("")
@router.get("/")
async def home() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/datasets", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_form(
    request: Request, next: Annotated[str | None, Query(max_length=2000)] = None
) -> HTMLResponse:
    return _page(request, "login.html", None, next=_safe_next(next), failed="")


UNKNOWN = (
    "this server does not know that token: paste the whole token (it starts with ss_), "
    "or ask whoever runs this server for a new one"
)
"""The sign-in error for an unknown token (the API's names an environment variable that a
browser user never set)."""


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    check_same_site(request)
    form = await read_form(request)
    secret = form.get("token", "").strip()
    target = _safe_next(form.get("next"))
    try:
        if not secret or len(secret) > 200:
            raise AuthenticationError("give a token (ss_...)", 401)
        principal = await principal_of(request, secret)
    except UnknownTokenError:
        return _page(request, "login.html", None, status=401, next=target, failed=UNKNOWN)
    except AuthenticationError as exc:
        return _page(request, "login.html", None, status=401, next=target, failed=str(exc))
    # Every session a token opens is charged to it (the address paid already, in the
    # budget guard): a token cannot open sessions by the hundred.
    accounts: TokenAccounts = request.app.state.token_accounts
    refused = accounts.charge(principal_key(principal), SIGN_IN_S)
    if refused is not None:
        page = _page(request, "login.html", None, status=429, next=target, failed=refused.detail)
        page.headers["retry-after"] = str(refused.retry_after_s)
        return page
    session_id = await session_store.open_session(request, secret, principal)
    response = RedirectResponse(target, status_code=303)
    set_session(response, request, session_id)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    check_csrf(request, await read_form(request))
    await session_store.close_session(request)  # every copy of the cookie is dead now
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    clear_session(response, request)
    return response


# -- datasets --------------------------------------------------------------------------


@router.get("/datasets", response_class=HTMLResponse)
async def datasets(
    request: Request,
    who: User,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    try:
        page = await run_in_threadpool(
            datasets_data.page, session, cursor=after, limit=PAGE, allowed=who.datasets
        )
    except APIError as exc:
        return _error(request, who, exc)
    return _page(request, "datasets.html", who, page=page)


@router.get("/datasets/{name}", response_class=HTMLResponse)
async def dataset(request: Request, who: User, session: SessionDep, name: str) -> HTMLResponse:
    def load() -> tuple[Any, Any]:
        who.require(Scope.read)
        who.require_dataset(name)
        found = datasets_data.public(session, name)
        row = datasets_data.get(session, name)
        return found, versions_data.page(session, row, cursor=None, limit=1000)

    try:
        found, versions = await run_in_threadpool(load)
    except APIError as exc:
        return _error(request, who, exc)
    return _page(request, "dataset.html", who, dataset=found, versions=versions.items)


@router.get("/datasets/{name}/{number}", response_class=HTMLResponse)
async def version(
    request: Request,
    *,
    who: User,
    session: SessionDep,
    name: str,
    number: int,
    sort: Annotated[str, Query(pattern="^(idx|samples|bytes)$")] = "idx",
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    page: Annotated[int, Query(ge=1, le=10_000_000)] = 1,
) -> HTMLResponse:
    def load() -> tuple[Any, list[ShardRow]]:
        who.require(Scope.read)
        who.require_dataset(name)
        row = versions_data.find(session, name, number)
        key = SHARD_SORTS[sort]
        ordering = (desc(key) if order == "desc" else asc(key), ShardRow.idx)
        shards = session.scalars(
            select(ShardRow)
            .where(ShardRow.version_id == row.id)
            .order_by(*ordering)
            .offset((page - 1) * PAGE)
            .limit(PAGE)
        ).all()
        return versions_data.to_public(row, name), list(shards)

    try:
        found, shards = await run_in_threadpool(load)
    except APIError as exc:
        return _error(request, who, exc)
    pages = max(1, -(-found.num_shards // PAGE))
    return _page(
        request,
        "version.html",
        who,
        version=found,
        shards=shards,
        sort=sort,
        order=order,
        page=page,
        pages=pages,
    )


# -- runs ------------------------------------------------------------------------------


def _sources_with_samples(
    session: Session, run_ids: list[int]
) -> dict[int, list[tuple[RunSourceRow, int]]]:
    out: dict[int, list[tuple[RunSourceRow, int]]] = {i: [] for i in run_ids}
    if not run_ids:
        return out
    rows = session.execute(
        select(RunSourceRow, VersionRow.total_samples)
        .outerjoin(VersionRow, VersionRow.id == RunSourceRow.version_id)
        .where(RunSourceRow.run_id.in_(run_ids))
        .order_by(RunSourceRow.run_id, RunSourceRow.position)
    ).all()
    for src, samples in rows:
        out[src.run_id].append((src, int(samples or 0)))
    return out


def _latest_checkpoints(session: Session, run_ids: list[int]) -> dict[int, CheckpointRow]:
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


@router.get("/runs", response_class=HTMLResponse)
async def runs(
    request: Request,
    who: User,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    def load() -> tuple[list[dict[str, Any]], str | None]:
        who.require(Scope.read)
        page = runs_data.page(session, cursor=after, limit=PAGE, allowed=who.datasets)
        ids = [r.id for r in page.items]
        rows = {r.id: r for r in session.scalars(select(RunRow).where(RunRow.id.in_(ids)))}
        sources = _sources_with_samples(session, ids)
        latest = _latest_checkpoints(session, ids)
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
            for run in page.items
        ]
        return shown, page.next_cursor

    try:
        shown, next_cursor = await run_in_threadpool(load)
    except APIError as exc:
        return _error(request, who, exc)
    return _page(request, "runs.html", who, runs=shown, next_cursor=next_cursor)


AUDIT_ON_PAGE = 20_000
"""Checkpoints up to which the run page shows the audit (beyond: `shardstream runs audit`)."""
INPUT_RANKS = 16
"""The slowest ranks the run page lists (`shardstream runs show RUN --json` has them all)."""


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run(request: Request, who: User, session: SessionDep, run_id: RunId) -> HTMLResponse:
    def load() -> dict[str, Any]:
        who.require(Scope.read)
        runs_data.require_readable(session, who, run_id)
        row = runs_data.get(session, run_id)
        sources = _sources_with_samples(session, [run_id])[run_id]
        recent = list(
            session.scalars(
                select(CheckpointRow)
                .where(CheckpointRow.run_id == run_id)
                .order_by(CheckpointRow.step.desc())
                .limit(CHART_POINTS)
            )
        )[::-1]
        total = session.scalar(
            select(func.count()).select_from(CheckpointRow).where(CheckpointRow.run_id == run_id)
        )
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
        report = audit_answer.audit(session, run_id) if (total or 0) <= AUDIT_ON_PAGE else None
        return {
            "inputs": input_stats_data.for_run(session, run_id, limit=INPUT_RANKS),
            "audit": report,
            "run": runs_data.to_public(row, [s for s, _ in sources]),
            "progress": state,
            "mixture": mix,
            "mixture_chart": chart,
            "mixture_legend": legend,
            "chart": progress.chart_svg(pts),
            "points": pts[::-1][:PAGE],
            "checkpoints": int(total or 0),
        }

    try:
        context = await run_in_threadpool(load)
    except APIError as exc:
        return _error(request, who, exc)
    return _page(request, "run.html", who, **context)


# -- tokens (admins) -------------------------------------------------------------------


def _tokens_page(
    request: Request, who: Principal, session: Session, *, created: Any = None, problem: str = ""
) -> HTMLResponse:
    page = tokens_data.page(session, cursor=None, limit=1000, who=who)
    status = 422 if problem else 200
    return _page(
        request,
        "tokens.html",
        who,
        status=status,
        tokens=page.items,
        created=created,
        problem=problem,
    )


@router.get("/tokens", response_class=HTMLResponse)
async def tokens(request: Request, who: User, session: SessionDep) -> HTMLResponse:
    try:
        who.require(Scope.admin)
        return await run_in_threadpool(_tokens_page, request, who, session)
    except APIError as exc:
        return _error(request, who, exc)


@router.post("/tokens", response_class=HTMLResponse)
async def create_token(request: Request, who: User, session: SessionDep) -> HTMLResponse:
    form = await read_form(request)
    try:
        check_csrf(request, form)
        who.require(Scope.admin)
        body = _token_request(form)
    except APIError as exc:
        return _error(request, who, exc)
    except ValueError as exc:
        return await run_in_threadpool(_tokens_page, request, who, session, problem=str(exc))

    def create() -> HTMLResponse:
        made = tokens_data.create_from(session, body, minted_by=who)
        return _tokens_page(request, who, session, created=made)

    try:
        return await run_in_threadpool(create)
    except APIError as exc:
        return _error(request, who, exc)


def _token_request(form: dict[str, str]) -> TokenCreate:
    """The API's token request from the form (``ValueError`` naming the bad field)."""
    from pydantic import ValidationError

    scope = form.get("scope", "read")
    names = [d.strip() for d in form.get("datasets", "").replace(",", " ").split() if d.strip()]
    days = form.get("expires_days", "").strip()
    expires = None
    if days:
        if not days.isdigit() or not 1 <= int(days) <= 36500:
            raise ValueError("expires in days: a whole number from 1 to 36500, or empty")
        expires = utcnow() + timedelta(days=int(days))
    try:
        return TokenCreate(
            name=form.get("name", "").strip(),
            scopes=[Scope(scope)] if scope in {s.value for s in Scope} else [],
            datasets=names or None,
            expires_at=expires,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{field}: {first['msg']}") from None


@router.post("/tokens/{token_id}/revoke")
async def revoke_token(
    request: Request, who: User, session: SessionDep, token_id: RunId
) -> Response:
    form = await read_form(request)
    try:
        check_csrf(request, form)
        who.require(Scope.admin)
        await run_in_threadpool(tokens_data.revoke, session, token_id, who=who)
        request.app.state.token_cache.forget(token_id)  # its sessions end at once
    except APIError as exc:
        return _error(request, who, exc)
    return RedirectResponse(f"{PREFIX}/tokens", status_code=303)
