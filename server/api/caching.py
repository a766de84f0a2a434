"""ETags, cache headers and in-memory snapshots of immutable (published) versions."""

from __future__ import annotations

from fastapi import Request, Response

from shardstream.errors import ConflictError
from shardstream.server.data import versions as versions_data
from shardstream.server.published import PublishedCache, VersionSnapshot

IMMUTABLE = "private, max-age=31536000, immutable"
NO_STORE = "no-store"


async def version_snapshot(request: Request, name: str, number: int) -> VersionSnapshot:
    """Version ``number`` of ``name``: from memory when published, else from the database
    (404 when there is no such version)."""
    cache: PublishedCache = request.app.state.published
    factory = request.app.state.read_sessions

    def load() -> VersionSnapshot:
        with factory() as session:
            return versions_data.snapshot(versions_data.find(session, name, number), name)

    return await cache.version(name, number, load)


def published_only(version: VersionSnapshot, what: str) -> None:
    """409 unless ``version`` is published."""
    if not version.published:
        raise ConflictError(
            f"version {version.number} of {version.dataset!r} is {version.status}; {what} is "
            "served for published versions only",
            409,
        )


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
