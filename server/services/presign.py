"""Presigned shard URLs: short-lived GETs for shards of a published version, so training
nodes need no bucket credentials.

The server decides what is signed: only keys the version lists, under the version's own
storage root, which must lie within a configured root (docs/server.md, trust boundary).
URLs are reused from the process's cache while at least half of the asked lifetime is
left (:class:`~shardstream.server.cache.published.PublishedCache`).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from shardstream.server.auth import Principal
from shardstream.server.cache.published import VersionSnapshot
from shardstream.server.data import shards as shards_data
from shardstream.server.storage.stores import confined_root, presign
from shardstream.wire import PresignResponse

from .parts import ServerParts
from .snapshots import published_only, version_snapshot


async def presign_urls(
    parts: ServerParts,
    who: Principal,
    name: str,
    number: int,
    *,
    keys: list[str],
    expires_s: int | None = None,
) -> PresignResponse:
    """URLs for ``keys`` of version ``number`` of ``name``, valid ``expires_s`` seconds
    (at most, and by default, ``SHARDSTREAM_PRESIGN_EXPIRES_S``).

    403 outside ``who``'s datasets, 404 for a key the version does not list, 409 unless
    the version is published. S3 roots get presigned URLs; local roots ``file://`` URLs
    (readable only on the server's machine or a shared file system).
    """
    who.require_dataset(name)
    version = await version_snapshot(parts, name, number)
    published_only(version, "presigned URLs")
    most = parts.settings.presign_expires_s
    lifetime = min(expires_s or most, most)
    wanted = list(dict.fromkeys(keys))

    def load_keys() -> frozenset[str]:
        with parts.read_sessions() as session:
            return shards_data.all_keys(session, version.id)

    known = await parts.published.keys(version, load_keys)

    def sign(missing: list[str]) -> tuple[dict[str, str], float]:
        if known is None:  # a version too large to keep its keys in memory
            with parts.read_sessions() as session:
                shards_data.require_keys(session, version.id, missing)
        return _sign(parts, version, missing, lifetime)

    if known is not None:
        shards_data.require_known(wanted, known)
    urls, until = await parts.published.urls(version, wanted, lifetime, sign)
    return PresignResponse(urls=urls, expires_at=datetime.fromtimestamp(until, UTC))


def _sign(
    parts: ServerParts, version: VersionSnapshot, keys: list[str], expires_s: int
) -> tuple[dict[str, str], float]:
    """Sign ``keys`` now: the URLs and the second they expire."""
    what = f"version {version.number} of {version.dataset!r}"
    root = confined_root(version.storage_root, parts.settings.resolved_storage_roots, what)
    store = parts.stores.get(root, for_clients=True)
    # Signatures carry their time in whole seconds (X-Amz-Date): a URL signed at
    # 12:00:00.9 stops working at 12:00:00 + expires_s. Signed within one second,
    # ``until`` is exactly the URLs' expiry: never later (expires_at stays true), never
    # earlier (the reuse cache never hands out a URL outliving the lifetime asked).
    for _ in range(3):
        second = math.floor(time.time())
        urls = presign(store, keys, expires_s)
        if math.floor(time.time()) == second:
            break
    return urls, second + expires_s
