"""Exception handlers: every error becomes a JSON ``ErrorResponse``, never a raw 500.

* shardstream :class:`~shardstream.errors.APIError` subclasses carry their status;
* request validation → 422 naming the field (``body.sources[0].weight: ...``), and so
  are bodies FastAPI could not decode (nested too deeply, not UTF-8), which it reports
  as a bare 400;
* SQLAlchemy: IntegrityError → 409, DataError → 422, OperationalError and other
  database failures → 503 whose message says what is wrong (a deleted SQLite file, a
  lost connection, a missing table; :func:`~shardstream.server.db.describe_failure`);
* storage failures → 503 naming the object; other shardstream errors → 422.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError as FastAPIValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException

from shardstream.errors import APIError, ShardstreamError, StorageError
from shardstream.server.db import describe_failure

log = logging.getLogger("shardstream.server")


def _error(status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"detail": detail}
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(status_code=status, content=body)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FastAPIValidationError)
    errors = [
        {"field": _field(e.get("loc", ())), "message": str(e.get("msg", "")), "type": e.get("type")}
        for e in exc.errors()
    ]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5]) or "invalid request"
    return _error(422, detail, errors)


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return _error(exc.status or 400, str(exc))


def _body_decode_problem(exc: HTTPException) -> str | None:
    """Why FastAPI could not decode a JSON body, when that is the client's doing.

    FastAPI answers 400 "error parsing the body" for anything ``json.loads`` raises other
    than a syntax error: RecursionError for nesting deeper than the parser's stack (about
    1,000 levels), ValueError for bytes that are not UTF-8 or an integer of more than
    4,300 digits. All are invalid requests: 422 naming the body, like other bad JSON.
    """
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, RecursionError):
        return "body: JSON nested too deeply to parse; documents may nest a few dozen levels"
    if isinstance(cause, UnicodeDecodeError):
        return f"body: not valid UTF-8 at byte {cause.start}"
    if isinstance(cause, ValueError):
        return f"body: invalid JSON: {str(cause)[:200]}"
    return None


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    problem = _body_decode_problem(exc)
    if problem is not None:
        return _error(422, problem, [{"field": "body", "message": problem, "type": "json_invalid"}])
    return JSONResponse(
        status_code=exc.status_code, content={"detail": str(exc.detail)}, headers=exc.headers
    )


async def _storage(request: Request, exc: Exception) -> JSONResponse:
    log.warning("storage error", extra={"path": request.url.path, "error": str(exc)})
    return _error(503, f"storage error: {exc}")


async def _shardstream(_: Request, exc: Exception) -> JSONResponse:
    return _error(422, str(exc))


async def _integrity(request: Request, exc: Exception) -> JSONResponse:
    log.info("integrity conflict", extra={"path": request.url.path, "error": str(exc)[:300]})
    return _error(409, "the request conflicts with stored data (a concurrent change?); retry")


async def _data(_: Request, exc: Exception) -> JSONResponse:
    return _error(422, "a value is out of range or invalid for the database")


async def _db_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable", extra={"path": request.url.path, "error": str(exc)[:300]})
    return _error(503, describe_failure(exc))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", extra={"path": request.url.path})
    return _error(500, "internal server error; the server log has the details")


def install(app: FastAPI) -> None:
    """Register every handler on ``app`` (most specific first)."""
    app.add_exception_handler(FastAPIValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(StorageError, _storage)
    app.add_exception_handler(ShardstreamError, _shardstream)
    app.add_exception_handler(sa_exc.IntegrityError, _integrity)
    app.add_exception_handler(sa_exc.DataError, _data)
    app.add_exception_handler(sa_exc.OperationalError, _db_unavailable)
    app.add_exception_handler(sa_exc.TimeoutError, _db_unavailable)
    app.add_exception_handler(sa_exc.DBAPIError, _db_unavailable)
    app.add_exception_handler(Exception, _unexpected)
