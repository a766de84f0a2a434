"""The one boundary where botocore, urllib3, httpx and OS errors become shardstream errors.

Every backend call runs inside :func:`storage_errors`; nothing raw escapes it. The
mapping (documented in docs/storage.md)::

    not found (404, NoSuchKey, NoSuchBucket, FileNotFoundError)  -> ObjectNotFoundError
    refused (403, AccessDenied, bad/missing credentials)          -> StoragePermissionError
    throttled/5xx/timeouts/cut connections/short bodies           -> TransientStorageError
      of which throttling (503, 429, SlowDown) and timeouts         -> ThrottledError
    anything else                                                 -> StorageError
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import botocore.exceptions as boto_exc
import httpx
import urllib3.exceptions

from shardstream.errors import (
    ObjectNotFoundError,
    ShardstreamError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
)

_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchBucket", "NoSuchUpload"}
_DENIED_CODES = {
    "403",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "TooManyRequests",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "OperationAborted",
}
_TRANSIENT_STATUS = {408, 429}
_THROTTLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "TooManyRequests",
    "RequestTimeout",
    "ServiceUnavailable",
}
_THROTTLE_STATUS = {408, 429, 503}
_TIMEOUTS: tuple[type[BaseException], ...] = (
    boto_exc.ReadTimeoutError,
    boto_exc.ConnectTimeoutError,
    urllib3.exceptions.TimeoutError,
    httpx.TimeoutException,
    socket.timeout,
    TimeoutError,
)


class ThrottledError(TransientStorageError):
    """The store pushed back (503/SlowDown, 429) or did not answer in time.

    A :class:`TransientStorageError` like any other (retried the same way), and also the
    signal the adaptive concurrency limit backs off on. ``retry_after_s`` is the pause the
    store asked for in ``Retry-After``, if any.
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds only; dates are ignored)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


_NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    boto_exc.ConnectionError,  # EndpointConnectionError, ConnectionClosedError, timeouts
    boto_exc.HTTPClientError,
    boto_exc.IncompleteReadError,
    boto_exc.ResponseStreamingError,
    urllib3.exceptions.HTTPError,  # ProtocolError, ReadTimeoutError raised while streaming
    http.client.HTTPException,  # IncompleteRead
    httpx.TransportError,  # timeouts, NetworkError, RemoteProtocolError (short body)
    socket.timeout,
    ConnectionError,  # reset, aborted, broken pipe
    TimeoutError,
)


_CREDENTIALS_HINT = (
    "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or StorageOptions) "
    "and that they may access this bucket and key"
)


def error_for_status(
    status: int,
    code: str,
    what: str,
    detail: str = "",
    *,
    denied_hint: str = _CREDENTIALS_HINT,
    retry_after_s: float | None = None,
) -> StorageError:
    """The shardstream error for an HTTP ``status`` / S3 error ``code`` about ``what``."""
    detail = f": {detail}" if detail else ""
    if code in _NOT_FOUND_CODES or status == 404:
        if code == "NoSuchBucket":
            return ObjectNotFoundError(f"{what}: the bucket does not exist{detail}; check the URL")
        return ObjectNotFoundError(f"{what} does not exist ({code or status}){detail}")
    if code in _DENIED_CODES or status in (401, 403):
        return StoragePermissionError(
            f"{what}: access denied ({code or status}){detail}; {denied_hint}"
        )
    if code in _THROTTLE_CODES or status in _THROTTLE_STATUS:
        return ThrottledError(
            f"{what}: the store is throttling ({code or status}){detail}", retry_after_s
        )
    if code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS or status >= 500:
        return TransientStorageError(f"{what}: server busy or failing ({code or status}){detail}")
    return StorageError(f"{what}: request failed ({code or status}){detail}")


def translate(exc: BaseException, what: str) -> ShardstreamError:
    """Map a third-party or OS exception raised while working on ``what`` to ours."""
    if isinstance(exc, ShardstreamError):
        return exc
    if isinstance(exc, boto_exc.ClientError):
        err = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        headers = meta.get("HTTPHeaders", {}) or {}
        return error_for_status(
            status,
            str(err.get("Code", "")),
            what,
            str(err.get("Message", "")),
            retry_after_s=retry_after(headers.get("retry-after")),
        )
    if isinstance(exc, (boto_exc.NoCredentialsError, boto_exc.PartialCredentialsError)):
        return StoragePermissionError(
            f"{what}: no usable credentials ({exc}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, an AWS profile, or StorageOptions.access_key_id/secret"
        )
    if isinstance(exc, httpx.HTTPStatusError):
        return error_for_status(exc.response.status_code, "", what)
    if isinstance(exc, httpx.UnsupportedProtocol):  # a wrong URL: retrying cannot help
        return StorageError(f"{what}: not an http(s) URL this store can fetch ({exc})")
    if isinstance(exc, _TIMEOUTS):
        return ThrottledError(f"{what}: no answer in time ({_describe(exc)})")
    if isinstance(exc, _NETWORK_ERRORS):
        return TransientStorageError(f"{what}: connection failed or cut ({_describe(exc)})")
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(f"{what} does not exist")
    if isinstance(exc, PermissionError):
        return StoragePermissionError(f"{what}: permission denied ({exc.strerror})")
    return StorageError(f"{what}: {_describe(exc)}")


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Run a block, re-raising any botocore/urllib3/httpx/OS error as a shardstream error."""
    try:
        yield
    except ShardstreamError:
        raise
    except (boto_exc.BotoCoreError, boto_exc.ClientError, httpx.HTTPError, OSError) as exc:
        raise translate(exc, what) from exc
    except (urllib3.exceptions.HTTPError, http.client.HTTPException) as exc:
        raise translate(exc, what) from exc


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
