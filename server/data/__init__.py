"""The data layer: every query lives here, one module per entity; routes never query.

Functions take a :class:`~sqlalchemy.orm.Session`, raise :mod:`shardstream.errors`
exceptions (with the HTTP status in ``status``) and leave committing to the caller's
session scope, so one request is one transaction.
"""

from __future__ import annotations

from shardstream.errors import RequestValidationError

ID_MAX = 2**31 - 1
"""The largest id of an entity with a 32-bit key (runs, tokens, version numbers)."""


def decode_cursor(cursor: str | None, *, what: str = "cursor", upper: int = 2**62) -> int | None:
    """Parse an integer keyset cursor (None: first page), or raise 422.

    ``upper`` bounds it by its key's column: a cursor past a 32-bit key (:data:`ID_MAX`)
    was never returned, and PostgreSQL could not even compare it.
    """
    if cursor is None or cursor == "":
        return None
    try:
        value = int(cursor)
    except ValueError:
        value = -1
    if not 0 <= value <= min(upper, 2**62 - 1):
        raise RequestValidationError(
            f"query.{what}: {cursor!r} is not a cursor returned by this endpoint", 422
        )
    return value
