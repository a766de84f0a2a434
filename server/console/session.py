"""Console sessions: the token in a cookie, CSRF tokens, and who is signed in.

The cookie holds the token secret itself (HttpOnly: page scripts cannot read it;
SameSite=Strict: other sites cannot make the browser send it; Path=/ui: the JSON API
never accepts it, it takes bearer headers only). Each request authenticates it like a
bearer token (:func:`~shardstream.server.api.deps.authenticate`), so expiry and
revocation apply at once and no session state lives in the server.

CSRF: every form carries ``HMAC-SHA256(sha256(secret), "console-csrf")``, which only a
page rendered for this session can know; a POST whose field does not match, or that a
browser marks as cross-site (``Sec-Fetch-Site``/``Origin``), is refused (403).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response

from shardstream.errors import AuthenticationError, PermissionDeniedError
from shardstream.server.auth import Principal, hash_secret

PREFIX = "/ui"
COOKIE = "shardstream_console"
FORM_LIMIT = 64 << 10
"""Bytes a console form may send (a token with 1,000 datasets fits)."""


def secret_of(request: Request) -> str | None:
    """The console session's token secret (``None`` outside the console or signed out)."""
    path = request.url.path
    if path != PREFIX and not path.startswith(PREFIX + "/"):
        return None
    return request.cookies.get(COOKIE) or None


def csrf_token(secret: str) -> str:
    """The CSRF token of the session of ``secret``."""
    key = hash_secret(secret).encode()
    return hmac.new(key, b"console-csrf", hashlib.sha256).hexdigest()


def set_session(response: Response, request: Request, secret: str) -> None:
    """Sign in: the session cookie (Secure when the request came over TLS)."""
    response.set_cookie(
        COOKIE,
        secret,
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
    if origin and origin != "null":
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            raise PermissionDeniedError("form post from another origin refused", 403)


def check_csrf(request: Request, form: dict[str, str]) -> None:
    """403 unless ``form`` carries this session's CSRF token and came from this site."""
    check_same_site(request)
    secret = secret_of(request)
    sent = form.get("csrf", "")
    if secret is None:
        raise AuthenticationError("signed out: sign in again", 401)
    if not hmac.compare_digest(sent.encode(), csrf_token(secret).encode()):
        raise PermissionDeniedError("the form's CSRF token is missing or wrong; reload", 403)


def who_label(principal: Principal) -> str:
    """How the header names the signed-in token."""
    return f"{principal.name} ({principal.scope.value})"
