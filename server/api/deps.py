"""Request dependencies as ``Annotated`` aliases: settings, database session, caller."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.orm import Session

from shardstream.server.auth import Principal, bearer_secret, matches_admin_secret, principal_for
from shardstream.server.config import Settings, get_settings
from shardstream.server.data import tokens as tokens_data
from shardstream.server.models import utcnow
from shardstream.wire import NAME_PATTERN, ErrorResponse, Scope

SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_db(request: Request) -> Iterator[Session]:
    """One session per request: committed when the route returns, rolled back on error."""
    session: Session = request.app.state.sessionmaker()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# scope="function": the commit happens before the response is sent, so a client never
# sees a success for a transaction that then failed to commit.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]


def get_principal(request: Request, session: SessionDep, settings: SettingsDep) -> Principal:
    """Authenticate the bearer token (401 when missing, unknown, revoked or expired)."""
    secret = bearer_secret(request.headers.get("authorization"))
    admin = settings.admin_token.get_secret_value() if settings.admin_token else None
    if matches_admin_secret(secret, admin):
        return Principal(name="admin (SHARDSTREAM_ADMIN_TOKEN)", scope=Scope.admin)
    return principal_for(tokens_data.find(session, secret), utcnow())


PrincipalDep = Annotated[Principal, Depends(get_principal, scope="function")]


def reader(principal: PrincipalDep) -> Principal:
    """A caller with at least ``read`` scope."""
    principal.require(Scope.read)
    return principal


def writer(principal: PrincipalDep) -> Principal:
    """A caller with at least ``write`` scope."""
    principal.require(Scope.write)
    return principal


def admin(principal: PrincipalDep) -> Principal:
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
RunId = Annotated[int, Path(ge=1, le=2**62, description="run id")]
