"""The console's token pages (admins): list, create within the admin's own rights, revoke."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from shardstream.errors import APIError
from shardstream.server.api.deps import RunId, SessionDep
from shardstream.server.auth import Principal
from shardstream.server.console import site
from shardstream.server.console.session import PREFIX, check_csrf, read_form
from shardstream.server.console.site import User
from shardstream.server.data import tokens as tokens_data
from shardstream.server.models import utcnow
from shardstream.wire import Scope, TokenCreate

router = site.console_router()


def _tokens_page(
    request: Request, who: Principal, session: Session, *, created: Any = None, problem: str = ""
) -> HTMLResponse:
    page = tokens_data.page(session, cursor=None, limit=1000, who=who)
    status = 422 if problem else 200
    return site.page(
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
        return site.error(request, who, exc)


@router.post("/tokens", response_class=HTMLResponse)
async def create_token(request: Request, who: User, session: SessionDep) -> HTMLResponse:
    form = await read_form(request)
    try:
        check_csrf(request, form)
        who.require(Scope.admin)
        body = _token_request(form)
    except APIError as exc:
        return site.error(request, who, exc)
    except ValueError as exc:
        return await run_in_threadpool(_tokens_page, request, who, session, problem=str(exc))

    def create() -> HTMLResponse:
        made = tokens_data.create_from(session, body, minted_by=who)
        return _tokens_page(request, who, session, created=made)

    try:
        return await run_in_threadpool(create)
    except APIError as exc:
        return site.error(request, who, exc)


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
        return site.error(request, who, exc)
    return RedirectResponse(f"{PREFIX}/tokens", status_code=303)
