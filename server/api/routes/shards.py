"""A version's shard index (paged or streamed as MDS ``index.json``) and presigned URLs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from shardstream.errors import ConflictError
from shardstream.server.api.caching import not_modified, set_cache_headers, version_etag
from shardstream.server.api.deps import (
    ERRORS,
    Cursor,
    DatasetName,
    Reader,
    SessionDep,
    SettingsDep,
    VersionNumber,
)
from shardstream.server.data import shards as data
from shardstream.server.data import versions as versions_data
from shardstream.server.models import VersionRow, utcnow
from shardstream.server.stores import presign
from shardstream.wire import Page, PresignRequest, PresignResponse, ShardRecord

router = APIRouter(
    prefix="/v1/datasets/{name}/versions/{number}", tags=["shards"], responses=ERRORS
)

ShardLimit = Annotated[int, Query(ge=1, le=10_000, description="shards per page")]


def _published(session: Session, name: str, number: int, what: str) -> VersionRow:
    row = versions_data.find(session, name, number)
    if row.status != "published":
        raise ConflictError(
            f"version {number} of {name!r} is {row.status}; {what} is served for published "
            "versions only",
            409,
        )
    return row


@router.get("/shards", response_model=Page[ShardRecord])
def list_shards(
    *,
    name: DatasetName,
    number: VersionNumber,
    request: Request,
    session: SessionDep,
    who: Reader,
    cursor: Cursor = None,
    limit: ShardLimit = 1000,
) -> Any:
    """One page of the shard index in shard order (keyset pages; cacheable once published)."""
    who.require_dataset(name)
    row = versions_data.find(session, name, number)
    etag = version_etag(row, cursor or 0, limit)
    cached = not_modified(request, etag)
    if cached is not None:
        return cached
    pages = request.app.state.page_cache
    body = pages.get(etag) if etag is not None else None
    if body is None:
        body = data.page_json(session, row.id, cursor=cursor, limit=limit)
        if etag is not None:
            pages.put(etag, body)
    out = Response(content=body, media_type="application/json")
    set_cache_headers(out, etag)
    return out


def _stream_index(factory: sessionmaker[Session], version_id: int) -> Iterator[bytes]:
    # The request's session is closed before a streamed body is sent: use a fresh one.
    # One yield per database chunk: each yield costs a thread hop, so never one per shard.
    with factory() as session:
        yield b'{"version": 2, "shards": [\n'
        sep = b""
        for entries in data.iter_mds_chunks(session, version_id):
            yield sep + b",\n".join(json.dumps(e).encode() for e in entries)
            sep = b",\n"
        yield b"\n]}\n"


@router.get(
    "/index.json",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/json": {}}, "description": "MDS index.json"}},
)
def mds_index(
    name: DatasetName, number: VersionNumber, request: Request, session: SessionDep, who: Reader
) -> Response:
    """The version as an MDS ``index.json`` (streamed, never built whole in memory)."""
    who.require_dataset(name)
    row = _published(session, name, number, "index.json")
    if data.missing_mds(session, row.id):
        raise ConflictError(
            f"version {number} of {name!r} was registered without MDS index entries; page "
            "through /shards instead",
            409,
        )
    etag = version_etag(row, "index")
    cached = not_modified(request, etag)
    if cached is not None:
        return cached
    response = StreamingResponse(
        _stream_index(request.app.state.sessionmaker, row.id), media_type="application/json"
    )
    set_cache_headers(response, etag)
    return response


@router.post("/presign")
def presign_urls(
    *,
    name: DatasetName,
    number: VersionNumber,
    body: PresignRequest,
    request: Request,
    session: SessionDep,
    who: Reader,
    settings: SettingsDep,
) -> PresignResponse:
    """Short-lived GET URLs for shards of a published version (no bucket credentials needed).

    S3 roots get presigned URLs; local roots get ``file://`` URLs (readable only on the
    server's machine or a shared file system).
    """
    who.require_dataset(name)
    row = _published(session, name, number, "presigned URLs")
    data.require_keys(session, row.id, body.keys)
    expires_s = min(body.expires_s or settings.presign_expires_s, settings.presign_expires_s)
    store = request.app.state.stores.get(row.storage_root, for_clients=True)
    urls = presign(store, list(dict.fromkeys(body.keys)), expires_s)
    return PresignResponse(urls=urls, expires_at=utcnow() + timedelta(seconds=expires_s))
