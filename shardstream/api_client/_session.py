"""The transport core every resource method goes through.

One ``httpx.Client`` per :class:`APISession`; :meth:`APISession.request` retries connection
errors, timeouts, 429 (waiting at least its ``Retry-After``: the server's per-token budget)
and 502/503/504 with jittered exponential backoff and translates every other error status
into its :mod:`shardstream.errors` class; GET answers with an ETag are cached in memory and
revalidated with ``If-None-Match``.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Self, TypeVar

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
from shardstream.retry import RetryPolicy

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
_RETRIES, _BACKOFF_S, _CAP_S = 5, 0.2, 5.0
"""The default policy: 5 retries, waits from 0.2 s doubling up to 5 s (about 6 s in all)."""
_MAX_CACHED = 4096
_LOG = logging.getLogger("shardstream.api_client")


def api_policy(retries: int = _RETRIES, backoff_s: float = _BACKOFF_S) -> RetryPolicy:
    """The policy of ``APIClient(retries=..., backoff_s=...)``: ``retries`` after the first
    attempt, waits doubling from ``backoff_s`` up to 5 s, each at least half its nominal
    length (jitter 0.5: a call is not retried at once by chance)."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"APIClient: retries must be an int >= 0, got {retries!r}")
    return RetryPolicy(attempts=retries + 1, base_s=backoff_s, cap_s=_CAP_S, jitter=0.5)


class APISession:
    """A connection pool to the server with retries, error translation and an ETag cache.

    Retries are a setting of the session: ``retries`` and ``backoff_s`` for the usual
    bounded policy, or a whole :class:`~shardstream.retry.RetryPolicy` as ``retry`` (with a
    deadline, say); :meth:`with_retry` gives the same pool under another policy.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int | None = None,
        backoff_s: float | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if retry is not None and (retries is not None or backoff_s is not None):
            raise ConfigError(
                "APIClient: pass either retry=RetryPolicy(...) or retries=/backoff_s=, not both"
            )
        self.retry = retry or api_policy(
            _RETRIES if retries is None else retries,
            _BACKOFF_S if backoff_s is None else backoff_s,
        )
        """How this session retries a call (see :mod:`shardstream.retry`)."""
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
        self._etags: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the connection pool (also that of every :meth:`with_retry` view of it)."""
        self._http.close()

    def with_retry(self, retry: RetryPolicy) -> Self:
        """This client under another retry policy, sharing its connection pool and ETag
        cache: one pool per server, each caller waiting as long as its calls are worth
        (the checkpoint committer rides out a server restart; a lookup gives up sooner)."""
        view = copy.copy(self)
        view.retry = retry
        return view

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
        warned = False
        attempts = self.retry.start()
        while True:
            try:
                response = self._http.request(
                    method, path, json=json, params=clean, headers=headers
                )
            except httpx.TransportError as exc:
                last, delay = exc, attempts.next_delay()
                if delay is None:
                    break
                if not warned:  # the call's first unanswered attempt: say so, once
                    warned = True
                    self._say_waiting(exc)
                time.sleep(delay)
                continue
            if response.status_code in _RETRY_STATUS:
                delay = attempts.next_delay(at_least=_retry_after(response))
                if delay is not None:
                    time.sleep(delay)
                    continue
            if response.status_code in ok or response.status_code == 304:
                return response
            raise _error_from(method, path, response)
        where = f"{method} {self.base_url}{path}"
        raise ServerUnavailableError(
            f"{where}: the server did not answer after {attempts.made} attempts in "
            f"{attempts.elapsed_s():.1f} s ({type(last).__name__}: {last})"
            f"; check that `shardstream server` runs at {self.base_url} (SHARDSTREAM_SERVER "
            "names it); APIClient(retries=..., backoff_s=...) sets how long a call waits",
            0,
        ) from last

    def _say_waiting(self, error: Exception) -> None:
        """One line, at the first failed attempt of a call, saying what the retries wait for
        (a dead server otherwise looks like a hang for the seconds they take)."""
        policy = self.retry
        more = (
            f"retrying {policy.attempts - 1} more times, "
            if policy.attempts is not None
            else "retrying, "
        )
        _LOG.warning(
            "the shardstream server at %s did not answer (%s: %s); %sfor up to %.0f s",
            self.base_url,
            type(error).__name__,
            error,
            more,
            policy.worst_wait_s(),
        )

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
