"""Console session queries: open, find, touch and close sessions, and sweep ended ones.

Rows are keyed by the sha256 of the session id (:mod:`shardstream.server.console.session`
makes both); the id itself is never stored. What makes a session valid (expiry, idle
time, its token, its binding) is decided by the caller, not here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from shardstream.server.models import ConsoleSessionRow, TokenRow

MAX_PER_TOKEN = 100
"""Sessions one token may hold at once; a sign-in beyond it ends that token's oldest, so
a token that signs in in a loop cannot grow the table without bound."""


def open_session(
    session: Session,
    *,
    id_hash: str,
    token_id: int | None,
    binding: str,
    now: datetime,
    lifetime: timedelta,
) -> None:
    """Record a new session (the caller commits)."""
    session.add(
        ConsoleSessionRow(
            id_hash=id_hash,
            token_id=token_id,
            binding=binding,
            created_at=now,
            expires_at=now + lifetime,
            last_seen_at=now,
        )
    )
    session.flush()
    _trim(session, token_id)


def _trim(session: Session, token_id: int | None) -> None:
    same = (
        ConsoleSessionRow.token_id.is_(None)
        if token_id is None
        else ConsoleSessionRow.token_id == token_id
    )
    oldest = session.scalars(
        select(ConsoleSessionRow.id)
        .where(same)
        .order_by(ConsoleSessionRow.id.desc())
        .offset(MAX_PER_TOKEN)
    ).all()
    if oldest:
        session.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.id.in_(oldest)))


def find(session: Session, id_hash: str) -> tuple[ConsoleSessionRow, TokenRow | None] | None:
    """The session with ``id_hash`` and the token it is bound to (None: the bootstrap
    admin's, or the token is gone), or None when there is no such session."""
    row = session.execute(
        select(ConsoleSessionRow, TokenRow)
        .outerjoin(TokenRow, TokenRow.id == ConsoleSessionRow.token_id)
        .where(ConsoleSessionRow.id_hash == id_hash)
    ).first()
    return None if row is None else (row[0], row[1])


def touch(session: Session, id_hash: str, now: datetime) -> None:
    """Record a request of the session at ``now`` (for its idle timeout)."""
    session.execute(
        update(ConsoleSessionRow)
        .where(ConsoleSessionRow.id_hash == id_hash)
        .values(last_seen_at=now)
    )


def close(session: Session, id_hash: str) -> None:
    """End one session (sign-out)."""
    session.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.id_hash == id_hash))


def close_for_token(session: Session, token_id: int) -> None:
    """End every session of a token (its revocation)."""
    session.execute(delete(ConsoleSessionRow).where(ConsoleSessionRow.token_id == token_id))


def sweep(session: Session, now: datetime, idle: timedelta) -> None:
    """Delete sessions past their expiry or idle for longer than ``idle``."""
    session.execute(
        delete(ConsoleSessionRow).where(
            or_(
                ConsoleSessionRow.expires_at <= now,
                ConsoleSessionRow.last_seen_at <= now - idle,
            )
        )
    )
