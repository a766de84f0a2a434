"""Security headers on every console response (pure ASGI middleware, ``/ui`` only).

* ``Content-Security-Policy``: nothing but the page's own inline styles and same-origin
  images and form targets; no scripts at all (the console has none); ``frame-ancestors
  'none'`` and ``X-Frame-Options: DENY`` (older browsers) so no other page can frame it
  and trick a signed-in person into clicking.
* ``X-Content-Type-Options: nosniff``: a response is only ever what its type says.
* ``Referrer-Policy: same-origin``: console addresses (dataset names, run ids) are not
  sent to other sites. Not ``no-referrer``: under it browsers send ``Origin: null`` on the
  console's own form posts, which sign-in refuses as a possible cross-site post.
* ``Cache-Control: no-store``: signed-in pages, and the one showing a new token's secret,
  are not kept by the browser or any proxy (the back button after sign-out shows nothing).

Added outermost, so the request guard's answers (401, 413) under ``/ui`` carry them too;
the JSON API's responses are left alone.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardstream.server.console.session import is_console_path

POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_NAMES = {name for name, _ in HEADERS}


class ConsoleHeaders:
    """Adds :data:`HEADERS` to every response under the console's prefix."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_console_path(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _NAMES]
                message = {**message, "headers": kept + HEADERS}
            await send(message)

        await self.app(scope, receive, send_with_headers)
