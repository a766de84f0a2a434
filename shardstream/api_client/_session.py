"""The transport core every resource method goes through.

One ``httpx.Client`` per :class:`APISession`; :meth:`APISession.request` retries connection
errors, timeouts, 429 (waiting at least its ``Retry-After``: the server's per-token budget)
and 502/503/504 with jittered exponential backoff and translates every other error status
into its :mod:`shardstream.errors` class; GET answers with an ETag are cached in memory and
revalidated with ``If-None-Match``.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from shardstream.errors import (
    APIError,
    AuthenticationError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    RequestValidationError,
    ServerUnavailableError,
)

M = TypeVar("M", bound=BaseModel)

_ERRORS: dict[int, type[APIError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: RequestValidationError,
}
_RETRY_STATUS = {429, 502, 503, 504}
_MAX_RETRY_AFTER_S = 60.0
"""The longest a ``Retry-After`` is honoured (a 429 from the server's per-token budget)."""
_MAX_CACHED = 4096
_LOG = logging.getLogger("shardstream.api_client")


class APISession:
    """A connection pool to the server with retries, error translation and an ETag cache."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url = base_url or os.environ.get("SHARDSTREAM_SERVER")
        if not base_url:
            raise ConfigError(
                "no server URL: pass base_url or set SHARDSTREAM_SERVER to the URL the server "
                "listens on (http://HOST:PORT; `shardstream server` uses port 8470 unless "
                "given --port)"
            )
        self.base_url = base_url.rstrip("/")
        token = token if token is not None else os.environ.get("SHARDSTREAM_TOKEN")
        headers = {"User-Agent": "shardstream-api-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self._retries = retries
        self._backoff_s = backoff_s
        self._etags: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> httpx.Response:
        """Send a request with retries; raise the mapped APIError for an error status."""
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        last: Exception | None = None
        retry_after = 0.0
        started = time.monotonic()
        for attempt in range(self._retries + 1):
            if attempt:
                backoff = min(5.0, self._backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1)
                time.sleep(max(backoff, retry_after))
            try:
                response = self._http.request(
                    method, path, json=json, params=clean, headers=headers
                )
            except httpx.TransportError as exc:
                if last is None and attempt < self._retries:
                    self._say_waiting(exc)
                last, retry_after = exc, 0.0
                continue
            if response.status_code in _RETRY_STATUS and attempt < self._retries:
                last = None
                retry_after = _retry_after(response)
                continue
            if response.status_code in ok or response.status_code == 304:
                return response
            raise _error_from(method, path, response)
        where = f"{method} {self.base_url}{path}"
        raise ServerUnavailableError(
            f"{where}: the server did not answer after {self._retries + 1} attempts in "
            f"{time.monotonic() - started:.1f} s"
            + (f" ({type(last).__name__}: {last})" if last else "")
            + f"; check that `shardstream server` runs at {self.base_url} (SHARDSTREAM_SERVER "
            "names it); APIClient(retries=..., backoff_s=...) sets how long a call waits",
            0,
        ) from last

    def _say_waiting(self, error: Exception) -> None:
        """One line, at the first failed attempt of a call, saying what the retries wait for
        (a dead server otherwise looks like a hang for the seconds they take)."""
        _LOG.warning(
            "the shardstream server at %s did not answer (%s: %s); retrying %d more times, "
            "for up to %.0f s",
            self.base_url,
            type(error).__name__,
            error,
            self._retries,
            self._worst_wait_s(),
        )

    def _worst_wait_s(self) -> float:
        """The longest the retries of one call sleep (each attempt's own timeout aside)."""
        return sum(min(5.0, self._backoff_s * 2**k) for k in range(self._retries))

    def _get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        cache_key = path + "?" + "&".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
        with self._lock:
            cached = self._etags.get(cache_key)
        if cached is None:
            response = self.request("GET", path, params=params)
        else:
            response = self.request(
                "GET", path, params=params, headers={"If-None-Match": cached[0]}
            )
            if response.status_code == 304:
                return cached[1]
        body = response.json()
        etag = response.headers.get("etag")
        if etag:
            with self._lock:
                if len(self._etags) >= _MAX_CACHED:
                    self._etags.pop(next(iter(self._etags)))
                self._etags[cache_key] = (etag, body)
        return body

    def _model(self, model: type[M], response: httpx.Response) -> M:
        return model.model_validate(response.json())

    def _pages(
        self, path: str, model: type[M], *, limit: int, params: Mapping[str, Any] | None = None
    ) -> Iterator[M]:
        for items in self._raw_pages(path, limit=limit, params=params, cache=True):
            for item in items:
                yield model.model_validate(item)

    def _raw_pages(
        self, path: str, *, limit: int, params: Mapping[str, Any] | None = None, cache: bool
    ) -> Iterator[list[Any]]:
        """The ``items`` of every page of a paged endpoint, as parsed JSON (``cache``: keep
        pages with an ETag for revalidation; bulk readers that keep the data pass False)."""
        cursor: str | None = None
        while True:
            query = {**(params or {}), "cursor": cursor, "limit": limit}
            body = (
                self._get_json(path, query)
                if cache
                else self.request("GET", path, params=query).json()
            )
            yield body["items"]
            cursor = body.get("next_cursor")
            if not cursor:
                return


def _retry_after(response: httpx.Response) -> float:
    """Seconds the server asked to wait (``Retry-After`` in seconds), at most a minute."""
    try:
        seconds = float(response.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0  # an HTTP date or garbage: the usual backoff
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


def json_body(model: BaseModel) -> Any:
    """``model`` as the JSON-ready value a request sends."""
    return model.model_dump(mode="json", exclude_none=False)


def _error_from(method: str, path: str, response: httpx.Response) -> APIError:
    try:
        detail = str(response.json().get("detail", "")) or response.text
    except ValueError:
        detail = response.text[:500]
    status = response.status_code
    cls = _ERRORS.get(status, ServerUnavailableError if status >= 500 else APIError)
    return cls(f"{method} {path}: {status} {detail}", status)
