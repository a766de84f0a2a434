"""The exception tree shared by every part of shardstream.

Every error a user can cause is one of these, with a message that names the thing at
fault (file and line, shard key, dataset name, setting) and what to do about it.
Third-party errors (botocore, httpx, SQLAlchemy, pyarrow) are translated where they
enter and chained with ``raise ... from exc``; they never reach users raw.

::

    ShardstreamError
    ├── ConfigError                 a setting or argument is invalid
    ├── InputError                  the builder's input data is malformed (file, line/row)
    ├── FormatError                 a shard or index.json is not valid MDS
    │   ├── CorruptShardError       truncated or garbled shard bytes
    │   ├── HashMismatchError       a shard's bytes do not match its recorded hash
    │   └── UnsupportedEncodingError  a column encoding we cannot read or write
    ├── StorageError                object store failures (after retries)
    │   ├── ObjectNotFoundError     the key / URL / file does not exist
    │   ├── StoragePermissionError  credentials refused
    │   └── TransientStorageError   throttling, 5xx, timeouts, cut connections (retryable)
    ├── APIError                    the metadata server refused a request
    │   ├── AuthenticationError     401: missing or invalid token
    │   ├── PermissionDeniedError   403: token lacks the scope or dataset
    │   ├── NotFoundError           404
    │   ├── ConflictError           409: e.g. a checkpoint step committed with another state
    │   ├── RequestValidationError  422: the request named a bad field
    │   └── ServerUnavailableError  the server could not be reached / 5xx after retries
    ├── PlanError                   epoch-plan parameters that cannot work together
    └── ResumeError                 a resume state that does not fit the dataset or plan
"""

from __future__ import annotations

import re


class ShardstreamError(Exception):
    """Base class of every error shardstream raises on purpose."""


class ConfigError(ShardstreamError, ValueError):
    """A setting or argument is invalid; the message names it and the accepted values."""


class InputError(ShardstreamError, ValueError):
    """The builder's input is malformed; the message names the file and line or row.

    The message is always one line: a third-party reason quoted in it (pyarrow's end in
    newlines, or span several) has its line breaks joined into spaces, so the command line
    prints one error line.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        text = re.sub(r"\s*\n\s*(?=\))", "", str(message).strip())  # "(reason\n)" -> "(reason)"
        super().__init__(re.sub(r"\s*\n\s*", " ", text), *args)


class FormatError(ShardstreamError):
    """A shard or ``index.json`` is not valid MDS; the message names the shard."""


class CorruptShardError(FormatError):
    """A shard's bytes are truncated or garbled."""


class HashMismatchError(FormatError):
    """A shard's bytes do not match the hash recorded in the index."""


class UnsupportedEncodingError(FormatError):
    """A column encoding that shardstream cannot read or write."""


class StorageError(ShardstreamError):
    """An object store operation failed (after retries, where retrying makes sense)."""


class ObjectNotFoundError(StorageError):
    """The object (key, URL or file) does not exist."""


class StoragePermissionError(StorageError):
    """The store refused the credentials or the presigned URL."""


class TransientStorageError(StorageError):
    """Throttling, 5xx, timeouts or cut connections: worth retrying."""


class APIError(ShardstreamError):
    """The metadata server refused a request.

    ``status`` is the HTTP status code (0 when no response arrived).
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class AuthenticationError(APIError):
    """401: the token is missing, unknown, revoked or expired."""


class PermissionDeniedError(APIError):
    """403: the token lacks the scope, or the dataset is outside its allow-list."""


class NotFoundError(APIError):
    """404: the dataset, version, run or checkpoint does not exist."""


class ConflictError(APIError):
    """409: the request conflicts with stored state (a name taken, a step re-committed)."""


class RequestValidationError(APIError):
    """422: a field of the request is invalid; the message names it."""


class ServerUnavailableError(APIError):
    """The server could not be reached, or kept failing after retries."""


class PlanError(ShardstreamError, ValueError):
    """Epoch-plan parameters that cannot work together (e.g. batch larger than the data)."""


class ResumeError(ShardstreamError):
    """A resume state that does not fit the dataset versions or plan parameters."""
