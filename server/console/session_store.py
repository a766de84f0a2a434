"""Console sessions in the database: open one at sign-in, resolve it on each request, end it.

A session is valid while all of these hold, checked on every console request:

* its row exists (sign-out and the token's revocation delete it);
* ``now < expires_at`` (``SHARDSTREAM_CONSOLE_SESSION_HOURS`` after sign-in, however
  active) and ``now < last_seen_at + SHARDSTREAM_CONSOLE_IDLE_MINUTES``;
* the secret it was opened with still signs in: the token is neither revoked nor expired,
  or, for the bootstrap admin, ``SHARDSTREAM_ADMIN_TOKEN`` is still that secret
  (:func:`~shardstream.server.console.session.session_binding`).

``last_seen_at`` is written at most once per :data:`TOUCH_EVERY`, so reading pages does
not turn into a write per request.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime, timedelta

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from shardstream.errors import AuthenticationError
from shardstream.server.auth import BOOTSTRAP_ADMIN, Principal, hash_secret, principal_for
from shardstream.server.config import Settings
from shardstream.server.console.session import (
    new_session_id,
    session_binding,
    session_hash,
    session_id_of,
)
from shardstream.server.data import console_sessions as data
from shardstream.server.models import ConsoleSessionRow, TokenRow, utcnow

TOUCH_EVERY = timedelta(seconds=60)
"""How stale ``last_seen_at`` may get before a request records itself (at most a quarter
of the idle timeout, so a session in use never looks idle)."""

_ENDED = "the console session ended (signed out, expired or idle); sign in again"


def _idle(settings: Settings) -> timedelta:
    return timedelta(minutes=settings.console_idle_minutes)


def _admin_hash(settings: Settings) -> str | None:
    secret = settings.admin_token.get_secret_value() if settings.admin_token else None
    return hash_secret(secret) if secret else None


def check(
    row: ConsoleSessionRow,
    token: TokenRow | None,
    session_id: str,
    settings: Settings,
    now: datetime,
) -> Principal:
    """The principal a found session stands for, or 401 when it has ended."""
    if row.expires_at <= now or row.last_seen_at <= now - _idle(settings):
        raise AuthenticationError(_ENDED, 401)
    if row.token_id is None:
        secret_hash, principal = _admin_hash(settings), BOOTSTRAP_ADMIN
    else:
        principal = principal_for(token, now)  # 401 when revoked, expired or gone
        secret_hash = token.secret_hash if token is not None else None
    if secret_hash is None or not hmac.compare_digest(
        row.binding, session_binding(session_id, secret_hash)
    ):
        raise AuthenticationError(_ENDED, 401)
    return principal


async def resolve(request: Request) -> Principal:
    """The principal of the request's console session (401 when none or ended)."""
    session_id = session_id_of(request)
    if session_id is None:
        raise AuthenticationError("not signed in to the console: sign in at /ui/login", 401)
    state = request.app.state
    settings: Settings = state.settings
    key = session_hash(session_id)
    now = utcnow()

    def lookup() -> tuple[ConsoleSessionRow, TokenRow | None] | None:
        with state.sessionmaker() as session:
            return data.find(session, key)

    found = await run_in_threadpool(lookup)
    if found is None:
        raise AuthenticationError(_ENDED, 401)
    row, token = found
    principal = check(row, token, session_id, settings, now)
    if row.last_seen_at <= now - min(TOUCH_EVERY, _idle(settings) / 4):
        await _write(request, lambda s: data.touch(s, key, now))
    return principal


async def open_session(request: Request, secret: str, principal: Principal) -> str:
    """Open a session for ``principal``, signed in with ``secret``; its new id.

    Also ends the session the browser had (signing in again replaces it) and sweeps
    sessions that ended by time, so the table holds live sessions only.
    """
    settings: Settings = request.app.state.settings
    session_id = new_session_id()
    binding = session_binding(session_id, hash_secret(secret))
    previous = session_id_of(request)
    now = utcnow()

    def write(session: Session) -> None:
        if previous is not None:
            data.close(session, session_hash(previous))
        data.sweep(session, now, _idle(settings))
        data.open_session(
            session,
            id_hash=session_hash(session_id),
            token_id=principal.token_id,
            binding=binding,
            now=now,
            lifetime=timedelta(hours=settings.console_session_hours),
        )

    await _write(request, write)
    return session_id


async def close_session(request: Request) -> None:
    """End the request's session (sign-out); nothing when it has none."""
    session_id = session_id_of(request)
    if session_id is not None:
        key = session_hash(session_id)
        await _write(request, lambda s: data.close(s, key))


async def _write(request: Request, work: Callable[[Session], None]) -> None:
    """Run ``work`` in a committed write transaction, in the SQLite write gate's turn
    (callers here are authenticated already, or hold a token that just signed in)."""
    state = request.app.state
    gate: asyncio.Lock | None = state.write_gate

    def run() -> None:
        with state.write_sessions() as session:
            work(session)
            session.commit()

    async with gate if gate is not None else nullcontext():
        await run_in_threadpool(run)
