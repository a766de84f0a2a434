"""The console's datasets -> versions -> shards pages."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from shardstream.errors import APIError
from shardstream.server.api.deps import SessionDep
from shardstream.server.console import site
from shardstream.server.console.site import User
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import shards as shards_data
from shardstream.server.data import versions as versions_data
from shardstream.server.models import ShardRow
from shardstream.wire import Scope

router = site.console_router()


@router.get("/datasets", response_class=HTMLResponse)
async def datasets(
    request: Request,
    who: User,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
) -> HTMLResponse:
    try:
        found = await run_in_threadpool(
            datasets_data.page, session, cursor=after, limit=site.PAGE, allowed=who.datasets
        )
    except APIError as exc:
        return site.error(request, who, exc)
    return site.page(request, "datasets.html", who, page=found)


@router.get("/datasets/{name}", response_class=HTMLResponse)
async def dataset(request: Request, who: User, session: SessionDep, name: str) -> HTMLResponse:
    def load() -> tuple[Any, Any]:
        who.require(Scope.read)
        who.require_dataset(name)
        found = datasets_data.public(session, name)
        row = datasets_data.get(session, name)
        return found, versions_data.page(session, row, cursor=None, limit=1000)

    try:
        found, versions = await run_in_threadpool(load)
    except APIError as exc:
        return site.error(request, who, exc)
    return site.page(request, "dataset.html", who, dataset=found, versions=versions.items)


@router.get("/datasets/{name}/{number}", response_class=HTMLResponse)
async def version(
    request: Request,
    *,
    who: User,
    session: SessionDep,
    name: str,
    number: int,
    sort: Annotated[str, Query(pattern="^(idx|samples|bytes)$")] = "idx",
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "asc",
    page: Annotated[int, Query(ge=1, le=10_000_000)] = 1,
) -> HTMLResponse:
    def load() -> tuple[Any, list[ShardRow]]:
        who.require(Scope.read)
        who.require_dataset(name)
        row = versions_data.find(session, name, number)
        shards = shards_data.sorted_rows(
            session,
            row.id,
            sort=sort,
            descending=order == "desc",
            offset=(page - 1) * site.PAGE,
            limit=site.PAGE,
        )
        return versions_data.to_public(row, name), shards

    try:
        found, shards = await run_in_threadpool(load)
    except APIError as exc:
        return site.error(request, who, exc)
    pages = max(1, -(-found.num_shards // site.PAGE))
    return site.page(
        request,
        "version.html",
        who,
        version=found,
        shards=shards,
        sort=sort,
        order=order,
        page=page,
        pages=pages,
    )
