"""ETags and cache headers for immutable (published) versions."""

from __future__ import annotations

from fastapi import Request, Response

from shardstream.server.models import VersionRow

IMMUTABLE = "private, max-age=31536000, immutable"
NO_STORE = "no-store"


def version_etag(row: VersionRow, *parts: object) -> str | None:
    """A strong ETag for a published version (plus page parameters); None for drafts."""
    if row.status != "published" or row.published_at is None:
        return None
    stamp = int(row.published_at.timestamp() * 1_000_000)
    suffix = "".join(f"-{p}" for p in parts)
    return f'"v{row.id}.{stamp}{suffix}"'


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


def set_cache_headers(response: Response, etag: str | None) -> None:
    """Long-lived caching for published content, none for drafts."""
    if etag is None:
        response.headers["Cache-Control"] = NO_STORE
    else:
        response.headers["ETag"] = etag
        response.headers["Cache-Control"] = IMMUTABLE
