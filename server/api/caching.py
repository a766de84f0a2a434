"""ETags and cache headers for immutable (published) versions."""

from __future__ import annotations

import threading
from collections import OrderedDict

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


class ByteCache:
    """A thread-safe LRU of immutable response bodies, bounded by total bytes.

    Only content of published versions goes in (it never changes), keyed by its ETag;
    every request still checks the version and the token before a cached body is used.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        """The cached body for ``key``, if any."""
        with self._lock:
            body = self._items.get(key)
            if body is not None:
                self._items.move_to_end(key)
            return body

    def put(self, key: str, body: bytes) -> None:
        """Remember ``body`` (bodies larger than a quarter of the cache are not kept)."""
        if len(body) > self._max // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self._max:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)
