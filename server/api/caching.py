"""ETags and cache headers of immutable (published) versions' answers.

The snapshots they are computed from live with the use cases
(:mod:`shardstream.server.services.snapshots`)."""

from __future__ import annotations

from fastapi import Request, Response

IMMUTABLE = "private, max-age=31536000, immutable"
NO_STORE = "no-store"


def not_modified(request: Request, etag: str | None) -> Response | None:
    """A 304 response when the client's If-None-Match already names ``etag``."""
    if etag is None:
        return None
    header = request.headers.get("if-none-match")
    if not header:
        return None
    tags = {t.strip().removeprefix("W/") for t in header.split(",")}
    if etag in tags or "*" in tags:
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": IMMUTABLE})
    return None


def accepts_gzip(request: Request) -> bool:
    """Whether the client's ``Accept-Encoding`` takes gzip (``gzip`` or ``*``, q > 0)."""
    for part in request.headers.get("accept-encoding", "").split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        weight = params.strip()
        if not weight:
            return True
        try:
            return float(weight.removeprefix("q=")) > 0
        except ValueError:
            return False
    return False


def set_cache_headers(response: Response, etag: str | None) -> None:
    """Long-lived caching for published content, none for drafts."""
    if etag is None:
        response.headers["Cache-Control"] = NO_STORE
    else:
        response.headers["ETag"] = etag
        response.headers["Cache-Control"] = IMMUTABLE
