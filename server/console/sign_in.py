"""Signing in and out of the console, and its home."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardstream.errors import AuthenticationError
from shardstream.server.api.deps import principal_of
from shardstream.server.auth import UnknownTokenError
from shardstream.server.budget import SIGN_IN_S, TokenAccounts, principal_key
from shardstream.server.console import session_store, site
from shardstream.server.console.session import (
    PREFIX,
    check_csrf,
    check_same_site,
    clear_session,
    read_form,
    set_session,
)

router = site.console_router()


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
    return site.page(request, "login.html", None, next=_safe_next(next), failed="")


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
        return site.page(request, "login.html", None, status=401, next=target, failed=UNKNOWN)
    except AuthenticationError as exc:
        return site.page(request, "login.html", None, status=401, next=target, failed=str(exc))
    # Every session a token opens is charged to it (the address paid already, in the
    # budget guard): a token cannot open sessions by the hundred.
    accounts: TokenAccounts = request.app.state.token_accounts
    refused = accounts.charge(principal_key(principal), SIGN_IN_S)
    if refused is not None:
        failed = refused.detail
        shown = site.page(request, "login.html", None, status=429, next=target, failed=failed)
        shown.headers["retry-after"] = str(refused.retry_after_s)
        return shown
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
