"""A version's shard index (paged or streamed as MDS ``index.json``) and presigned URLs."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from shardstream.server.api.caching import accepts_gzip, not_modified, set_cache_headers
from shardstream.server.api.deps import ERRORS, Cursor, DatasetName, Reader, VersionNumber
from shardstream.server.cache.published import gzip_etag
from shardstream.server.services import index
from shardstream.server.services.parts import ServerParts
from shardstream.server.services.presign import presign_urls as presign
from shardstream.server.services.snapshots import published_only, version_snapshot
from shardstream.wire import Page, PresignRequest, PresignResponse, ShardRecord

router = APIRouter(
    prefix="/v1/datasets/{name}/versions/{number}", tags=["shards"], responses=ERRORS
)

GZIP_MIN_LIMIT = 100  # pages asked with at least this many shards may be compressed

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
    parts = ServerParts.of(request.app.state)
    version = await version_snapshot(parts, name, number)
    etag = version.etag(cursor or 0, limit)
    # Large pages of published versions go out gzip-compressed (~6x smaller) to clients
    # that take it, compressed once per process like the page itself.
    gzipped = etag is not None and limit >= GZIP_MIN_LIMIT and accepts_gzip(request)
    load = partial(index.page_json, parts.read_sessions, version, cursor=cursor, limit=limit)
    return await _published_body(request, parts, etag, load, gzipped=gzipped)


async def _published_body(
    request: Request,
    parts: ServerParts,
    etag: str | None,
    load: Callable[[], bytes],
    *,
    gzipped: bool,
) -> Response:
    """A body of a published version (``etag``) from the process's cache (``load`` on a
    miss), gzip-compressed when ``gzipped``, or 304 when the client has it already."""
    sent_etag = gzip_etag(etag) if gzipped and etag is not None else etag
    cached = not_modified(request, sent_etag)
    if cached is not None:
        return cached
    body = await parts.published.page(etag, load, gzipped=gzipped)
    out = Response(content=body, media_type="application/json")
    if gzipped:
        out.headers["Content-Encoding"] = "gzip"
    if etag is not None:
        out.headers["Vary"] = "Accept-Encoding"
    set_cache_headers(out, sent_etag)
    return out


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
    parts = ServerParts.of(request.app.state)
    version = await version_snapshot(parts, name, number)
    published_only(version, "index.json")
    etag = version.etag("index")
    factory = parts.read_sessions
    if etag is not None and index.kept_whole(version):
        load = partial(index.index_json, factory, version)
        return await _published_body(request, parts, etag, load, gzipped=accepts_gzip(request))

    cached = not_modified(request, etag)
    if cached is not None:
        return cached
    await run_in_threadpool(index.require_entries, factory, version)
    response = StreamingResponse(
        index.index_chunks(factory, version), media_type="application/json"
    )
    set_cache_headers(response, etag)
    return response


@router.post("/presign")
async def presign_urls(
    *, name: DatasetName, number: VersionNumber, body: PresignRequest, request: Request, who: Reader
) -> PresignResponse:
    """Short-lived GET URLs for shards of a published version (no bucket credentials needed).

    S3 roots get presigned URLs; local roots get ``file://`` URLs (readable only on the
    server's machine or a shared file system).
    """
    parts = ServerParts.of(request.app.state)
    return await presign(parts, who, name, number, keys=body.keys, expires_s=body.expires_s)
