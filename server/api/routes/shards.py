"""A version's shard index (paged or streamed as MDS ``index.json``) and presigned URLs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from shardstream.errors import ConflictError
from shardstream.server.api.caching import (
    accepts_gzip,
    not_modified,
    published_only,
    set_cache_headers,
    version_snapshot,
)
from shardstream.server.api.deps import (
    ERRORS,
    Cursor,
    DatasetName,
    Reader,
    SettingsDep,
    VersionNumber,
)
from shardstream.server.data import shards as data
from shardstream.server.published import gzip_etag
from shardstream.server.stores import confined_root, presign
from shardstream.wire import Page, PresignRequest, PresignResponse, ShardRecord

router = APIRouter(
    prefix="/v1/datasets/{name}/versions/{number}", tags=["shards"], responses=ERRORS
)

GZIP_MIN_LIMIT = 100  # pages asked with at least this many shards may be compressed

# Shards per database read of a streamed index.json: a reader that stops reading keeps
# at most one such chunk (~1 MB) in memory, and no connection.
INDEX_CHUNK = 1000

ShardLimit = Annotated[int, Query(ge=1, le=10_000, description="shards per page")]


@router.get("/shards", response_model=Page[ShardRecord])
async def list_shards(
    *,
    name: DatasetName,
    number: VersionNumber,
    request: Request,
    who: Reader,
    cursor: Cursor = None,
    limit: ShardLimit = 1000,
) -> Any:
    """One page of the shard index in shard order (keyset pages; cacheable once published)."""
    who.require_dataset(name)
    version = await version_snapshot(request, name, number)
    etag = version.etag(cursor or 0, limit)
    # Large pages of published versions go out gzip-compressed (~6x smaller) to clients
    # that take it, compressed once per process like the page itself.
    gzipped = etag is not None and limit >= GZIP_MIN_LIMIT and accepts_gzip(request)
    factory = request.app.state.read_sessions

    def load() -> bytes:
        with factory() as session:
            return data.page_json(session, version.id, cursor=cursor, limit=limit)

    return await _published_body(request, etag, load, gzipped=gzipped)


async def _published_body(
    request: Request, etag: str | None, load: Callable[[], bytes], *, gzipped: bool
) -> Response:
    """A body of a published version (``etag``) from the process's cache (``load`` on a
    miss), gzip-compressed when ``gzipped``, or 304 when the client has it already."""
    sent_etag = gzip_etag(etag) if gzipped and etag is not None else etag
    cached = not_modified(request, sent_etag)
    if cached is not None:
        return cached
    body = await request.app.state.published.page(etag, load, gzipped=gzipped)
    out = Response(content=body, media_type="application/json")
    if gzipped:
        out.headers["Content-Encoding"] = "gzip"
    if etag is not None:
        out.headers["Vary"] = "Accept-Encoding"
    set_cache_headers(out, sent_etag)
    return out


def _stream_index(factory: sessionmaker[Session], version_id: int, shards: int) -> Iterator[bytes]:
    # The request's session is closed before a streamed body is sent: use a fresh one,
    # and give its connection back after every chunk. A client that stops reading stalls
    # this generator between two yields; it must then hold no connection (nor, on
    # PostgreSQL, an open transaction), or a few stalled readers would take the pool.
    # Published versions never change, so chunks read in separate sessions fit together.
    # One yield per database chunk: each yield costs a thread hop, so never one per shard.
    session = factory()
    try:
        yield b'{"version": 2, "shards": [\n'
        sep = b""
        sent = 0
        for entries in data.iter_mds_chunks(session, version_id, chunk_size=INDEX_CHUNK):
            session.close()  # the next chunk checks a connection out again
            sent += len(entries)
            yield sep + ",\n".join(entries).encode()
            sep = b",\n"
        if sent != shards:
            # Deleted while streaming: end the body unfinished rather than well-formed
            # but short, so a client never trusts a partial index.
            raise RuntimeError(f"version {version_id} changed while its index was streamed")
        yield b"\n]}\n"
    finally:
        session.close()


# index.json of a published version up to this many shards (~3 MB at our writer's ~800
# bytes per entry) is built once per process and kept with the index pages; larger ones
# are streamed from the database every time, never held whole.
INDEX_CACHE_SHARDS = 4_000


@router.get(
    "/index.json",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/json": {}}, "description": "MDS index.json"}},
)
async def mds_index(
    name: DatasetName, number: VersionNumber, request: Request, who: Reader
) -> Response:
    """The version as an MDS ``index.json``.

    A published version's index never changes: up to ``INDEX_CACHE_SHARDS`` shards it is
    built once per process (gzip-compressed too, for clients that take it) and answered
    from memory, a query-free request like an index page. Larger ones are streamed, never
    built whole in memory.
    """
    who.require_dataset(name)
    version = await version_snapshot(request, name, number)
    published_only(version, "index.json")
    etag = version.etag("index")
    factory = request.app.state.read_sessions

    def refuse_without_entries(session: Session) -> None:
        if data.missing_mds(session, version.id):
            raise ConflictError(
                f"version {number} of {name!r} was registered without MDS index entries; "
                "page through /shards instead",
                409,
            )

    if etag is not None and version.num_shards <= INDEX_CACHE_SHARDS:

        def load() -> bytes:
            with factory() as session:
                refuse_without_entries(session)
            return b"".join(_stream_index(factory, version.id, version.num_shards))

        return await _published_body(request, etag, load, gzipped=accepts_gzip(request))

    cached = not_modified(request, etag)
    if cached is not None:
        return cached

    def missing() -> None:
        with factory() as session:
            refuse_without_entries(session)

    await run_in_threadpool(missing)
    response = StreamingResponse(
        _stream_index(factory, version.id, version.num_shards),
        media_type="application/json",
    )
    set_cache_headers(response, etag)
    return response


@router.post("/presign")
async def presign_urls(
    *,
    name: DatasetName,
    number: VersionNumber,
    body: PresignRequest,
    request: Request,
    who: Reader,
    settings: SettingsDep,
) -> PresignResponse:
    """Short-lived GET URLs for shards of a published version (no bucket credentials needed).

    S3 roots get presigned URLs; local roots get ``file://`` URLs (readable only on the
    server's machine or a shared file system).
    """
    who.require_dataset(name)
    version = await version_snapshot(request, name, number)
    published_only(version, "presigned URLs")
    expires_s = min(body.expires_s or settings.presign_expires_s, settings.presign_expires_s)
    factory = request.app.state.read_sessions
    stores = request.app.state.stores
    cache = request.app.state.published
    keys = list(dict.fromkeys(body.keys))
    what = f"version {number} of {name!r}"

    def load_keys() -> frozenset[str]:
        with factory() as session:
            return data.all_keys(session, version.id)

    known = await cache.keys(version, load_keys)

    def sign(missing: list[str]) -> tuple[dict[str, str], float]:
        if known is None:  # a version too large to keep its keys in memory
            with factory() as session:
                data.require_keys(session, version.id, missing)
        root = confined_root(version.storage_root, settings.resolved_storage_roots, what)
        store = stores.get(root, for_clients=True)
        # Signatures carry their time in whole seconds (X-Amz-Date): a URL signed at
        # 12:00:00.9 stops working at 12:00:00 + expires_s. Signed within one second,
        # ``until`` is exactly the URLs' expiry: never later (expires_at stays true), never
        # earlier (the reuse cache never hands out a URL outliving the lifetime asked).
        for _ in range(3):
            second = math.floor(time.time())
            urls = presign(store, missing, expires_s)
            if math.floor(time.time()) == second:
                break
        return urls, second + expires_s

    if known is not None:
        data.require_known(keys, known)
    urls, until = await cache.urls(version, keys, expires_s, sign)
    return PresignResponse(urls=urls, expires_at=datetime.fromtimestamp(until, UTC))
