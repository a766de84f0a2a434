"""Token queries."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.errors import NotFoundError
from shardstream.server.auth import Principal, hash_secret, new_secret
from shardstream.server.models import TokenRow, utcnow
from shardstream.wire import Page, Scope, TokenCreate, TokenPublic

from . import console_sessions, decode_cursor


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


def create_from(session: Session, body: TokenCreate, *, minted_by: Principal) -> TokenPublic:
    """Create a token from the API request body, within ``minted_by``'s rights (403)."""
    minted_by.require_can_mint(body.scopes, body.datasets, body.expires_at)
    return create(
        session,
        name=body.name,
        scopes=body.scopes,
        datasets=body.datasets,
        expires_at=body.expires_at,
    )


def _scopes(row: TokenRow) -> list[Scope]:
    return [Scope(s) for s in row.scopes.split(",") if s]


def visible(row: TokenRow, who: Principal) -> bool:
    """Whether ``who`` may see and revoke ``row``: a token that reaches nothing beyond
    ``who``'s own rights (a restricted admin manages only tokens within its datasets)."""
    return who.within_rights(_scopes(row), row.datasets)


def find(session: Session, secret: str) -> TokenRow | None:
    """The token whose secret is ``secret`` (by hash), if any."""
    return session.scalars(
        select(TokenRow).where(TokenRow.secret_hash == hash_secret(secret))
    ).first()


def get(session: Session, token_id: int, *, who: Principal) -> TokenRow:
    """The token with ``token_id``, or 404 (also when it is beyond ``who``'s rights, so a
    restricted admin learns nothing about other teams' tokens)."""
    row = session.get(TokenRow, token_id)
    if row is None or not visible(row, who):
        raise NotFoundError(f"token {token_id} not found", 404)
    return row


def revoke(session: Session, token_id: int, *, who: Principal) -> TokenPublic:
    """Revoke a token within ``who``'s rights (idempotent); it stops working at once,
    and its console sessions end with it."""
    row = get(session, token_id, who=who)
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    console_sessions.close_for_token(session, row.id)
    return to_public(row)


_SCAN_CHUNK = 500


def page(session: Session, *, cursor: str | None, limit: int, who: Principal) -> Page[TokenPublic]:
    """A page of the tokens ``who`` may see, by id (never their secrets).

    The allow-list is a JSON column, so the filter runs here, over chunks of rows, until
    the page is full or the table ends.
    """
    after = decode_cursor(cursor) or 0
    items: list[TokenPublic] = []
    more = False
    while not more:
        rows = session.scalars(
            select(TokenRow).where(TokenRow.id > after).order_by(TokenRow.id).limit(_SCAN_CHUNK)
        ).all()
        for row in rows:
            if not visible(row, who):
                continue
            if len(items) == limit:
                more = True
                break
            items.append(to_public(row))
        if len(rows) < _SCAN_CHUNK:
            break
        after = rows[-1].id
    nxt = str(items[-1].id) if more else None
    return Page[TokenPublic](items=items, next_cursor=nxt)


def has_admin(session: Session) -> bool:
    """Whether an unrevoked admin token exists in the database."""
    rows = session.scalars(select(TokenRow.scopes).where(TokenRow.revoked_at.is_(None))).all()
    return any("admin" in s.split(",") for s in rows)
