"""``/v1/tokens`` (admin only) and ``/v1/whoami``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, status
from pydantic import BaseModel

from shardstream.server.api.deps import ERRORS, Admin, Cursor, Limit, PrincipalDep, SessionDep
from shardstream.server.data import tokens as data
from shardstream.wire import Page, Scope, TokenCreate, TokenPublic

router = APIRouter(prefix="/v1", tags=["tokens"], responses=ERRORS)

TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="token id")]


class WhoAmI(BaseModel):
    """The calling token's identity."""

    name: str
    scope: Scope
    datasets: list[str] | None


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, session: SessionDep, who: Admin) -> TokenPublic:
    """Create a token; the response is the only time its secret is shown."""
    return data.create_from(session, body)


@router.get("/tokens")
def list_tokens(
    session: SessionDep, who: Admin, cursor: Cursor = None, limit: Limit = 100
) -> Page[TokenPublic]:
    """Tokens by id (metadata only, never secrets)."""
    return data.page(session, cursor=cursor, limit=limit)


@router.get("/tokens/{token_id}")
def get_token(token_id: TokenId, session: SessionDep, who: Admin) -> TokenPublic:
    """One token's metadata."""
    return data.to_public(data.get(session, token_id))


@router.delete("/tokens/{token_id}")
def revoke_token(
    token_id: TokenId, request: Request, session: SessionDep, who: Admin
) -> TokenPublic:
    """Revoke a token; this server refuses it at once, other replicas within
    ``SHARDSTREAM_TOKEN_CACHE_S`` seconds."""
    revoked = data.revoke(session, token_id)
    request.app.state.token_cache.forget(token_id)
    return revoked


@router.get("/whoami")
def whoami(who: PrincipalDep) -> WhoAmI:
    """Who the calling token is: name, scope and dataset allow-list."""
    return WhoAmI(
        name=who.name,
        scope=who.scope,
        datasets=sorted(who.datasets) if who.datasets is not None else None,
    )
