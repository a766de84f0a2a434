"""Token queries."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.errors import NotFoundError
from shardstream.server.auth import hash_secret, new_secret
from shardstream.server.models import TokenRow, utcnow
from shardstream.wire import Page, Scope, TokenCreate, TokenPublic

from . import decode_cursor


def to_public(row: TokenRow, secret: str | None = None) -> TokenPublic:
    """A token's metadata (the secret only when just created)."""
    return TokenPublic(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        scopes=[Scope(s) for s in row.scopes.split(",") if s],
        datasets=row.datasets,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        secret=secret,
    )


def create(
    session: Session,
    *,
    name: str,
    scopes: list[Scope],
    datasets: list[str] | None = None,
    expires_at: datetime | None = None,
) -> TokenPublic:
    """Create a token; the returned model carries the secret, which is never stored."""
    secret = new_secret()
    row = TokenRow(
        name=name,
        prefix=secret[:10],
        secret_hash=hash_secret(secret),
        scopes=",".join(sorted({s.value for s in scopes})),
        datasets=sorted(set(datasets)) if datasets is not None else None,
        created_at=utcnow(),
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return to_public(row, secret)


def create_from(session: Session, body: TokenCreate) -> TokenPublic:
    """Create a token from the API request body."""
    return create(
        session,
        name=body.name,
        scopes=body.scopes,
        datasets=body.datasets,
        expires_at=body.expires_at,
    )


def find(session: Session, secret: str) -> TokenRow | None:
    """The token whose secret is ``secret`` (by hash), if any."""
    return session.scalars(
        select(TokenRow).where(TokenRow.secret_hash == hash_secret(secret))
    ).first()


def get(session: Session, token_id: int) -> TokenRow:
    """The token with ``token_id``, or 404."""
    row = session.get(TokenRow, token_id)
    if row is None:
        raise NotFoundError(f"token {token_id} not found", 404)
    return row


def revoke(session: Session, token_id: int) -> TokenPublic:
    """Revoke a token (idempotent); it stops working at once."""
    row = get(session, token_id)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return to_public(row)


def page(session: Session, *, cursor: str | None, limit: int) -> Page[TokenPublic]:
    """A page of tokens by id (never their secrets)."""
    after = decode_cursor(cursor) or 0
    rows = session.scalars(
        select(TokenRow).where(TokenRow.id > after).order_by(TokenRow.id).limit(limit + 1)
    ).all()
    items = [to_public(r) for r in rows[:limit]]
    nxt = str(items[-1].id) if len(rows) > limit else None
    return Page[TokenPublic](items=items, next_cursor=nxt)


def has_admin(session: Session) -> bool:
    """Whether an unrevoked admin token exists in the database."""
    rows = session.scalars(select(TokenRow.scopes).where(TokenRow.revoked_at.is_(None))).all()
    return any("admin" in s.split(",") for s in rows)
