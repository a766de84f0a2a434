"""``/v1/datasets``: create, list, get, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from shardstream.errors import ConflictError, PermissionDeniedError
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
    """Create a dataset (409 if the name is taken); its owner is the calling token's name
    (a caller-sent ``owner`` other than empty is refused with 422)."""
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
    force: Annotated[
        bool, Query(description="delete even while running runs read it (admins only)")
    ] = False,
) -> Response:
    """Delete a dataset's metadata (its stored shards stay); 409 while a run reads it.

    ``force`` overrides that protection of running jobs, which may belong to other
    principals, so only an admin over the dataset may use it; a writer's ``force`` is
    honoured only when no running run reads the dataset (403 otherwise).
    """
    who.require_dataset(name)
    if force and not who.is_admin_over([name]):
        try:
            data.delete_dataset(session, name, force=False)
        except ConflictError as exc:
            raise PermissionDeniedError(
                f"{exc}; only an admin over {name!r} may delete it with ?force=true while "
                f"runs read it (token {who.name!r} has scope {who.scope.value!r})",
                403,
            ) from None
    else:
        data.delete_dataset(session, name, force=force)
    request.app.state.published.forget_dataset(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
