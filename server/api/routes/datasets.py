"""``/v1/datasets``: create, list, get, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from shardstream.server.api.deps import (
    ERRORS,
    Cursor,
    DatasetName,
    Limit,
    Reader,
    SessionDep,
    Writer,
)
from shardstream.server.data import datasets as data
from shardstream.wire import DatasetCreate, DatasetPublic, Page

router = APIRouter(prefix="/v1/datasets", tags=["datasets"], responses=ERRORS)


@router.post("", status_code=status.HTTP_201_CREATED)
def create_dataset(body: DatasetCreate, session: SessionDep, who: Writer) -> DatasetPublic:
    """Create a dataset (409 if the name is taken)."""
    who.require_dataset(body.name)
    data.create(session, body, owner=who.name)
    return data.public(session, body.name)


@router.get("")
def list_datasets(
    session: SessionDep, who: Reader, cursor: Cursor = None, limit: Limit = 100
) -> Page[DatasetPublic]:
    """Datasets by name, a page at a time (only those the token may read)."""
    return data.page(session, cursor=cursor, limit=limit, allowed=who.datasets)


@router.get("/{name}")
def get_dataset(name: DatasetName, session: SessionDep, who: Reader) -> DatasetPublic:
    """One dataset with its version counts."""
    who.require_dataset(name)
    return data.public(session, name)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_dataset(
    name: DatasetName,
    request: Request,
    session: SessionDep,
    who: Writer,
    force: Annotated[bool, Query(description="delete even while running runs read it")] = False,
) -> Response:
    """Delete a dataset's metadata (its stored shards stay); 409 while a run reads it."""
    who.require_dataset(name)
    data.delete_dataset(session, name, force=force)
    request.app.state.published.forget_dataset(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
