"""API tokens and their scopes."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated

from pydantic import Field

from ._fields import Name, PublicModel, StrictModel, UTCTimestamp


class Scope(str, Enum):
    """Token scopes; each one includes the ones before it (admin ⊇ write ⊇ read)."""

    read = "read"
    write = "write"
    admin = "admin"


class TokenCreate(StrictModel):
    """Create an API token; ``datasets`` restricts it to those datasets (None: all).

    A token can only mint tokens within its own rights: scopes it holds, a subset of its
    datasets, an expiry no later than its own. ``expires_at`` without a timezone is UTC.
    """

    name: Name
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=3)]
    datasets: Annotated[list[Name], Field(max_length=1000)] | None = None
    expires_at: UTCTimestamp | None = None


class TokenPublic(PublicModel):
    """A token's metadata; ``secret`` is set only in the response that created it."""

    id: int
    name: str
    prefix: str
    scopes: list[Scope]
    datasets: list[str] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    secret: str | None = None
