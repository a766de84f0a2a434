"""What every console page shares: the templates, the page frame (who is signed in, the
form token), error pages, and the sign-in guard that sends a person without a session
to the sign-in form."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from shardstream.errors import APIError, AuthenticationError
from shardstream.server.api.deps import authenticate
from shardstream.server.auth import Principal
from shardstream.server.console import display
from shardstream.server.console.input_view import sparkline
from shardstream.server.console.session import (
    PREFIX,
    clear_session,
    csrf_token,
    session_id_of,
    who_label,
)
from shardstream.server.models import utcnow
from shardstream.wire import Scope

PAGE = 100
"""Rows a console list shows at most (a page)."""

templates = Jinja2Templates(directory=str(Path(__file__).with_name("templates")))
templates.env.filters.update(
    size=display.size, when=display.when, age=display.age, quote=lambda s: quote(str(s), safe="")
)
templates.env.filters["sparkline"] = sparkline


def console_router() -> APIRouter:
    """A router for one group of console pages (under ``/ui``, not in the OpenAPI)."""
    return APIRouter(prefix=PREFIX, include_in_schema=False)


class SignInError(Exception):
    """No valid session: the page answers with a redirect to the sign-in form."""


async def signed_in(request: Request) -> Principal:
    """The session's token (redirects to sign-in when there is none or it has ended)."""
    if session_id_of(request) is None:
        raise SignInError
    try:
        return await authenticate(request)
    except AuthenticationError:
        raise SignInError from None


User = Annotated[Principal, Depends(signed_in, scope="function")]


def page(
    request: Request, name: str, who: Principal | None, status: int = 200, **context: Any
) -> HTMLResponse:
    """Template ``name`` in the console's frame, for ``who`` (None: signed out)."""
    session_id = session_id_of(request) if who is not None else None
    base = {
        "who": who,
        "who_label": who_label(who) if who else "",
        "is_admin": who is not None and who.scope is Scope.admin,
        "csrf": csrf_token(session_id) if session_id else "",
        "now": utcnow(),
    }
    return templates.TemplateResponse(request, name, {**base, **context}, status_code=status)


def error(request: Request, who: Principal | None, exc: APIError) -> HTMLResponse:
    """The error page for ``exc``, with its status."""
    status = exc.status or 500
    return page(request, "error.html", who, status=status, status_code=status, message=str(exc))


def _sign_in_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?next={quote(target, safe='')}", status_code=303)


def handle_sign_in(request: Request, exc: Exception) -> Response:
    """The app's handler for :class:`SignInError` (registered by :func:`.pages.install`)."""
    response = _sign_in_redirect(request)
    if session_id_of(request) is not None:
        clear_session(response, request)  # an ended session: drop the cookie
    return response
