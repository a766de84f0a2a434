"""``/v1/tokens`` (admin only, each admin within its own rights) and ``/v1/whoami``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request, status
from pydantic import BaseModel

from shardstream.server.api.deps import ERRORS, Admin, Cursor, Limit, PrincipalDep, SessionDep
from shardstream.server.data import tokens as data
from shardstream.wire import Page, Scope, TokenCreate, TokenPublic

router = APIRouter(prefix="/v1", tags=["tokens"], responses=ERRORS)

TokenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="token id")]


class WhoAmI(BaseModel):
    """The calling token's identity; ``principal`` is what its runs' ``owner`` holds."""

    name: str
    scope: Scope
    datasets: list[str] | None
    principal: str
    expires_at: datetime | None = None


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, session: SessionDep, who: Admin) -> TokenPublic:
    """Create a token within the caller's own rights (its scopes, a subset of its
    datasets, an expiry no later than its own; 403 otherwise); the response is the only
    time its secret is shown."""
    return data.create_from(session, body, minted_by=who)


@router.get("/tokens")
def list_tokens(
    session: SessionDep, who: Admin, cursor: Cursor = None, limit: Limit = 100
) -> Page[TokenPublic]:
    """Tokens by id (metadata only, never secrets): those within the caller's rights."""
    return data.page(session, cursor=cursor, limit=limit, who=who)


@router.get("/tokens/{token_id}")
def get_token(token_id: TokenId, session: SessionDep, who: Admin) -> TokenPublic:
    """One token's metadata (404 for a token beyond the caller's rights)."""
    return data.to_public(data.get(session, token_id, who=who))


@router.delete("/tokens/{token_id}")
def revoke_token(
    token_id: TokenId, request: Request, session: SessionDep, who: Admin
) -> TokenPublic:
    """Revoke a token within the caller's rights (404 otherwise); this server refuses it
    at once, other replicas within ``SHARDSTREAM_TOKEN_CACHE_S`` seconds."""
    revoked = data.revoke(session, token_id, who=who)
    request.app.state.token_cache.forget(token_id)
    return revoked


@router.get("/whoami")
def whoami(who: PrincipalDep) -> WhoAmI:
    """Who the calling token is: name, scope and dataset allow-list."""
    return WhoAmI(
        name=who.name,
        scope=who.scope,
        datasets=sorted(who.datasets) if who.datasets is not None else None,
        principal=who.principal_id,
        expires_at=who.expires_at,
    )
