"""Request dependencies as ``Annotated`` aliases: settings, database session, caller."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import nullcontext
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from shardstream.errors import AuthenticationError
from shardstream.server.auth import (
    BOOTSTRAP_ADMIN,
    PRINCIPAL,
    Principal,
    TokenCache,
    bearer_secret,
    hash_secret,
    matches_admin_secret,
    principal_for,
)
from shardstream.server.cache.singleflight import SingleFlight
from shardstream.server.config import Settings
from shardstream.server.console import session_store as console_sessions
from shardstream.server.console.session import is_console_path
from shardstream.server.data import tokens as tokens_data
from shardstream.server.models import TokenRow, utcnow
from shardstream.wire import NAME_PATTERN, ErrorResponse, Scope


async def app_settings(request: Request) -> Settings:
    """The settings the app was built with (from :func:`get_settings` unless given).

    Read from the app, not through ``dependency_overrides``: FastAPI re-analyzes an
    overridden dependency on every request, which cost ~1.5 ms each.
    """
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(app_settings)]


_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def write_turn(request: Request) -> AsyncIterator[None]:
    """A write's turn at the database: the caller authenticated, then, on SQLite, the
    app's write gate held until the request's transaction is over.

    SQLite has one writer at a time; writers queue on an asyncio lock (waiting holds no
    thread). The gate is taken here, so only by an authenticated caller whose body has
    been received and parsed already (FastAPI parses bodies before it resolves
    dependencies, and :class:`~shardstream.server.limits.RequestGuard` bounds how long
    that may take): a client that never finishes its body holds nothing. A dependency of
    :func:`get_db` rather than part of it, so queued writers do not hold the session
    slots (``DB_CONCURRENCY``) that readers need.
    """
    if request.method in _READ_METHODS:
        yield
        return
    await authenticate(request)  # an unknown caller never queues for the gate
    gate: asyncio.Lock | None = request.app.state.write_gate
    async with gate if gate is not None else nullcontext():
        yield


async def get_db(
    request: Request, _turn: Annotated[None, Depends(write_turn, scope="function")]
) -> AsyncIterator[Session]:
    """One session per request: committed when the route returns, rolled back on error.

    Async, so opening and closing a session costs no thread hop (a session does no I/O
    until its first query); only a write's COMMIT runs in the thread pool. Reads use a
    session bound for autocommit on PostgreSQL (no BEGIN/COMMIT round trips); writes one
    that begins with BEGIN IMMEDIATE on SQLite (see ``db._sqlite_begin``), in their turn
    (:func:`write_turn`).
    """
    write = request.method not in _READ_METHODS
    state = request.app.state
    session: Session = (state.write_sessions if write else state.read_sessions)()
    try:
        yield session
        if write:
            await run_in_threadpool(session.commit)
    except BaseException:
        if session.in_transaction():
            await run_in_threadpool(session.rollback)
        raise
    finally:
        session.close()  # the transaction is over: returning the connection is cheap


# Requests holding a session at once, per process. Kept below the worker threadpool (40)
# so a request that holds row locks can always get a thread to commit: otherwise threads
# blocked on those locks could take every thread and nobody would ever commit.
DB_CONCURRENCY = 16

# scope="function": the commit happens before the response is sent, so a client never
# sees a success for a transaction that then failed to commit.
SessionDep = Annotated[Session, Depends(get_db, scope="function", max_concurrency=DB_CONCURRENCY)]


_FAILED = "shardstream.authentication_failed"


async def authenticate(request: Request) -> Principal:
    """Authenticate the caller (401 when missing, unknown, revoked or expired): the bearer
    token on the API, the session cookie on console pages.

    Remembered on the request, failures too: the budget guard authenticates every
    request to find its account, the request guard write requests before their body is
    read, and the routes' dependencies then reuse that answer. Async on
    purpose: a cached token costs no thread hop; a lookup runs in the pool.
    """
    known: Principal | None = request.scope.get(PRINCIPAL)
    if known is not None:
        return known
    failed: AuthenticationError | None = request.scope.get(_FAILED)
    if failed is not None:  # the budget guard asked already: no second lookup
        raise type(failed)(str(failed), failed.status)
    try:
        if is_console_path(request.url.path):
            # Console pages take their session cookie and nothing else; the API never does.
            principal = await console_sessions.resolve(request)
        else:
            secret = bearer_secret(request.headers.get("authorization"))
            principal = await principal_of(request, secret)
    except AuthenticationError as exc:
        request.scope[_FAILED] = exc
        raise
    request.scope[PRINCIPAL] = principal
    return principal


async def principal_of(request: Request, secret: str) -> Principal:
    """The caller a token secret stands for (401 when unknown, revoked or expired)."""
    settings: Settings = request.app.state.settings
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    if matches_admin_secret(secret, admin):
        return BOOTSTRAP_ADMIN
    return await _lookup(request, secret)


async def _lookup(request: Request, secret: str) -> Principal:
    cache: TokenCache = request.app.state.token_cache
    key = hash_secret(secret)
    now = utcnow()
    principal = cache.get(key, now)
    if principal is not None:
        return principal
    factory = request.app.state.sessionmaker

    def lookup() -> TokenRow | None:
        with factory() as session:
            return tokens_data.find(session, secret)

    async def fetch() -> Principal:
        found = principal_for(await run_in_threadpool(lookup), now)
        cache.put(key, found)
        return found

    # Every rank of a starting job presents the same token at once: one lookup for all.
    lookups: SingleFlight[str, Principal] = request.app.state.token_lookups
    return await lookups.run(key, fetch)


async def get_principal(request: Request) -> Principal:
    """The caller (a dependency; see :func:`authenticate`)."""
    return await authenticate(request)


PrincipalDep = Annotated[Principal, Depends(get_principal, scope="function")]


async def reader(principal: PrincipalDep) -> Principal:
    """A caller with at least ``read`` scope."""
    principal.require(Scope.read)
    return principal


async def writer(principal: PrincipalDep) -> Principal:
    """A caller with at least ``write`` scope."""
    principal.require(Scope.write)
    return principal


async def admin(principal: PrincipalDep) -> Principal:
    """A caller with ``admin`` scope."""
    principal.require(Scope.admin)
    return principal


Reader = Annotated[Principal, Depends(reader, scope="function")]
Writer = Annotated[Principal, Depends(writer, scope="function")]
Admin = Annotated[Principal, Depends(admin, scope="function")]

Cursor = Annotated[
    str | None, Query(max_length=200, description="next_cursor of the previous page")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="items per page")]

_ERROR = {"model": ErrorResponse}
ERRORS: dict[int | str, dict[str, object]] = {
    401: {**_ERROR, "description": "missing, unknown, revoked or expired token"},
    403: {**_ERROR, "description": "the token lacks the scope or the dataset"},
    404: {**_ERROR, "description": "not found"},
    409: {**_ERROR, "description": "conflicts with stored state"},
    422: {**_ERROR, "description": "invalid request; the message names the field"},
    503: {**_ERROR, "description": "database or storage unavailable; retry"},
}

DatasetName = Annotated[
    str, Path(min_length=1, max_length=128, pattern=NAME_PATTERN, description="dataset name")
]
VersionNumber = Annotated[int, Path(ge=1, le=2**31 - 1, description="version number")]
# Run ids are 32-bit columns: a larger id is refused alike on SQLite and PostgreSQL (whose
# driver would otherwise fail to bind it), as version numbers and token ids are.
RunId = Annotated[int, Path(ge=1, le=2**31 - 1, description="run id")]
