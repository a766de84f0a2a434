"""``/v1/datasets/{name}/versions``: drafts, shard batches, publish, abort, get, list."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response, status

from shardstream.server.api.caching import not_modified, set_cache_headers
from shardstream.server.api.deps import (
    ERRORS,
    Cursor,
    DatasetName,
    Limit,
    Reader,
    SessionDep,
    SettingsDep,
    VersionNumber,
    Writer,
)
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import versions as data
from shardstream.server.services.parts import ServerParts
from shardstream.server.services.publish import publish
from shardstream.server.services.snapshots import version_snapshot
from shardstream.wire import (
    Page,
    Scope,
    ShardBatch,
    ShardBatchResult,
    VersionCreate,
    VersionPublic,
    VersionUpdate,
)

router = APIRouter(prefix="/v1/datasets/{name}/versions", tags=["versions"], responses=ERRORS)


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[!-~]+$",  # visible ASCII
        description="a key unique to one logical request (a uuid4), repeated on its retries: "
        "a replay returns the draft the first request created (200) instead of a new one",
    ),
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": VersionPublic, "description": "replay of an Idempotency-Key"}},
)
def create_version(
    *,
    name: DatasetName,
    body: VersionCreate,
    response: Response,
    session: SessionDep,
    who: Writer,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> VersionPublic:
    """Open a draft version; shards are added in batches, then it is published or aborted.

    With an ``Idempotency-Key`` header that already created a draft of this dataset, that
    draft is returned as it is now (200) instead of a new one; the same key with another
    body is a 422.
    """
    who.require_dataset(name)
    dataset = datasets_data.get(session, name)
    row, created = data.create_draft(
        session,
        dataset,
        body,
        created_by=who.name,
        roots=settings.resolved_storage_roots,
        may_register=who.scope == Scope.admin,
        visible=who.datasets,
        idempotency_key=idempotency_key,
    )
    if not created:
        response.status_code = status.HTTP_200_OK
    return data.to_public(row, name)


@router.get("")
def list_versions(
    name: DatasetName, session: SessionDep, who: Reader, cursor: Cursor = None, limit: Limit = 100
) -> Page[VersionPublic]:
    """A dataset's versions by number, a page at a time."""
    who.require_dataset(name)
    return data.page(session, datasets_data.get(session, name), cursor=cursor, limit=limit)


@router.get("/latest", response_model=VersionPublic)
def latest_version(name: DatasetName, session: SessionDep, who: Reader) -> Any:
    """The newest published version (404 if none is published yet)."""
    who.require_dataset(name)
    dataset = datasets_data.get(session, name)
    return data.to_public(data.latest_published(session, dataset), name)


@router.get("/{number}", response_model=VersionPublic)
async def get_version(
    *, name: DatasetName, number: VersionNumber, request: Request, who: Reader
) -> Any:
    """One version; published versions carry an ETag and answer 304 to If-None-Match."""
    who.require_dataset(name)
    version = await version_snapshot(ServerParts.of(request.app.state), name, number)
    etag = version.etag()
    cached = not_modified(request, etag)
    if cached is not None:
        return cached
    response = Response(content=version.public_json, media_type="application/json")
    set_cache_headers(response, etag)
    return response


@router.patch("/{number}")
def update_version(
    *,
    name: DatasetName,
    number: VersionNumber,
    body: VersionUpdate,
    session: SessionDep,
    who: Writer,
    settings: SettingsDep,
) -> VersionPublic:
    """Fill in a draft's columns, config or lineage (admins: its storage root, before any
    shard)."""
    who.require_dataset(name)
    row = data.update_draft(
        session,
        datasets_data.get(session, name),
        number,
        body,
        roots=settings.resolved_storage_roots,
        may_register=who.scope == Scope.admin,
        visible=who.datasets,
    )
    return data.to_public(row, name)


@router.post("/{number}/shards")
def add_shards(
    name: DatasetName, number: VersionNumber, body: ShardBatch, session: SessionDep, who: Writer
) -> ShardBatchResult:
    """Append a batch of shards to a draft (indexes continue from its shard count)."""
    who.require_dataset(name)
    return data.add_shards(session, datasets_data.get(session, name), number, body)


@router.post("/{number}/publish")
async def publish_version(
    *, name: DatasetName, number: VersionNumber, request: Request, who: Writer
) -> VersionPublic:
    """Check every shard in storage (exists, stated size), then publish.

    No database connection is held while storage is checked: the shard list is read in
    one short session, checked within ``SHARDSTREAM_STORAGE_DEADLINE_S`` (504 after), and
    a second short transaction publishes the draft if it did not change meanwhile.
    """
    return await publish(ServerParts.of(request.app.state), who, name, number)


@router.post("/{number}/abort")
def abort_version(
    name: DatasetName, number: VersionNumber, session: SessionDep, who: Writer
) -> VersionPublic:
    """Abort a draft (idempotent); a published version cannot be aborted (409)."""
    who.require_dataset(name)
    row = data.abort(session, datasets_data.get(session, name), number)
    return data.to_public(row, name)
