"""Console sessions: the cookie, session ids, CSRF tokens, and who is signed in.

Signing in with a token opens a server-side session (:mod:`.session_store`): the cookie
holds a random session id (256 bits), never the token secret, and the database holds only
its sha256. The cookie is HttpOnly (page scripts cannot read it), SameSite=Strict (other
sites cannot make the browser send it), Path=/ui, and Secure behind TLS. Only console
pages accept it, and they accept nothing else: the JSON API takes bearer tokens only,
and a session id is no token there.

CSRF: every form carries ``HMAC-SHA256(session id, "console-csrf")``, which only a page
rendered for this session can know; a POST whose field does not match, or that a
browser marks as cross-site (``Sec-Fetch-Site``/``Origin``), is refused (403).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response

from shardstream.errors import AuthenticationError, PermissionDeniedError
from shardstream.server.auth import Principal, hash_secret

PREFIX = "/ui"
COOKIE = "shardstream_console"
FORM_LIMIT = 64 << 10
"""Bytes a console form may send (a token with 1,000 datasets fits)."""


SESSION_BYTES = 32
"""Random bytes in a session id (``secrets.token_urlsafe``: 43 characters)."""


def is_console_path(path: str) -> bool:
    """Whether ``path`` is a console page (``/ui`` or below)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def session_id_of(request: Request) -> str | None:
    """The session id in the request's cookie (``None`` outside the console, or none)."""
    if not is_console_path(request.url.path):
        return None
    value = request.cookies.get(COOKIE) or None
    if value is not None and len(value) > 200:
        return None  # not one of ours; no need to hash it
    return value


def new_session_id() -> str:
    """A fresh random session id."""
    return secrets.token_urlsafe(SESSION_BYTES)


def session_hash(session_id: str) -> str:
    """The stored form of a session id (sha256 hex, like token secrets)."""
    return hash_secret(session_id)


def session_binding(session_id: str, secret_hash: str) -> str:
    """What ties a session to the secret that opened it: an HMAC, under the session id,
    of that secret's sha256. Checked on every request, so the session stands only for
    that secret (for the bootstrap admin, only while ``SHARDSTREAM_ADMIN_TOKEN`` is it),
    and the stored row alone reveals nothing about the secret."""
    return hmac.new(session_id.encode(), secret_hash.encode(), hashlib.sha256).hexdigest()


def csrf_token(session_id: str) -> str:
    """The CSRF token of the session ``session_id``."""
    return hmac.new(session_id.encode(), b"console-csrf", hashlib.sha256).hexdigest()


def set_session(response: Response, request: Request, session_id: str) -> None:
    """Sign in: the session cookie (Secure when the request came over TLS).

    No ``Max-Age``: the browser drops it when it closes, and the server ends the session
    itself (expiry, idle timeout, sign-out, revocation) whatever the browser keeps.
    """
    response.set_cookie(
        COOKIE,
        session_id,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=_over_tls(request),
    )


def clear_session(response: Response, request: Request) -> None:
    """Sign out: expire the cookie."""
    response.delete_cookie(
        COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=_over_tls(request)
    )


def _over_tls(request: Request) -> bool:
    forwarded = request.headers.get("x-forwarded-proto", "")
    return request.url.scheme == "https" or forwarded.split(",")[0].strip() == "https"


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as ``{field: last value}`` (at most
    :data:`FORM_LIMIT` bytes; the request guard bounds its arrival time)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise PermissionDeniedError("console forms are sent url-encoded", 415)
    body = await request.body()
    if len(body) > FORM_LIMIT:
        raise PermissionDeniedError(f"form larger than {FORM_LIMIT} bytes", 413)
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[-1] for name, values in fields.items()}


def check_same_site(request: Request) -> None:
    """403 for a form post a browser says came from another site."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise PermissionDeniedError("cross-site form post refused", 403)
    origin = request.headers.get("origin")
    if origin is None:
        return  # not a browser, or one that predates Origin: nothing a site could forge
    # "null" is an opaque origin (a sandboxed frame, a data: page, a file): never this
    # site's own form, which browsers post with its real origin (Referrer-Policy
    # same-origin, see .headers). A "null" Host never matches either.
    host = request.headers.get("host", "")
    if origin.strip().lower() == "null" or urlsplit(origin).netloc != host:
        raise PermissionDeniedError(f"form post from another origin ({origin[:100]}) refused", 403)


def check_csrf(request: Request, form: dict[str, str]) -> None:
    """403 unless ``form`` carries this session's CSRF token and came from this site."""
    check_same_site(request)
    session_id = session_id_of(request)
    sent = form.get("csrf", "")
    if session_id is None:
        raise AuthenticationError("signed out: sign in again", 401)
    if not hmac.compare_digest(sent.encode(), csrf_token(session_id).encode()):
        raise PermissionDeniedError("the form's CSRF token is missing or wrong; reload", 403)


def who_label(principal: Principal) -> str:
    """How the header names the signed-in token."""
    return f"{principal.name} ({principal.scope.value})"
