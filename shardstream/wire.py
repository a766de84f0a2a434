"""The wire schema: pydantic models shared by the metadata server and the SDK.

One schema family per entity (``ThingCreate`` for requests, ``ThingPublic`` for responses),
separate from the server's table models, so the server and every client agree on one
definition. Importing this module needs only pydantic (no server extra).

Validation that protects the server lives here too: names match
``[a-z0-9][a-z0-9._-]{0,127}`` and shard keys are relative ``/``-separated paths that can
never escape a version's storage root.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)
_MAX_INT = 2**62  # fits a signed 64-bit column with room to spare
MAX_KEY_LENGTH = 1024
MAX_SHARDS_PER_BATCH = 5000
MAX_PRESIGN_KEYS = 1000

T = TypeVar("T")


def check_name(value: str) -> str:
    """Return ``value`` if it is a valid dataset/run/token name, else raise ValueError."""
    if not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid name {value!r}: use 1-128 characters from a-z, 0-9, '.', '_', '-', "
            "starting with a letter or digit"
        )
    return value


def check_shard_key(key: str) -> str:
    """Return ``key`` if it is a safe relative object key, else raise ValueError.

    A safe key is a ``/``-separated relative path without empty, ``.`` or ``..`` segments,
    backslashes or control characters, so joining it to a storage root can never leave it.
    """
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"shard key must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}")
    if key.startswith("/") or "\\" in key or any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise ValueError(
            f"shard key {key!r} must be a relative '/'-separated path without backslashes "
            "or control characters"
        )
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(
            f"shard key {key!r} has an empty, '.' or '..' segment; keys cannot leave the "
            "version's storage root"
        )
    if ":" in key.split("/", 1)[0]:
        raise ValueError(f"shard key {key!r} looks like a URL; give a key relative to the root")
    return key


def _check_text(value: str) -> str:
    # PostgreSQL text cannot hold NUL; refuse it here rather than fail in the database.
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    return value


def _check_json(value: Any) -> Any:
    """Refuse JSON values a database cannot store (NaN/inf, NUL characters)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("JSON numbers must be finite (no NaN or Infinity)")
    if isinstance(value, str):
        _check_text(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_text(k)
            _check_json(v)
    elif isinstance(value, list):
        for v in value:
            _check_json(v)
    return value


Name = Annotated[
    str,
    Field(min_length=1, max_length=128, json_schema_extra={"pattern": NAME_PATTERN}),
    AfterValidator(check_name),
]
ShardKey = Annotated[str, AfterValidator(check_shard_key)]
Text = Annotated[str, Field(max_length=10_000), AfterValidator(_check_text)]
JSONObject = Annotated[dict[str, Any], AfterValidator(_check_json)]
Count = Annotated[int, Field(ge=0, le=_MAX_INT)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Public(BaseModel):
    # Responses ignore unknown fields so an older SDK keeps working against a newer server.
    model_config = ConfigDict(from_attributes=True, extra="ignore")


class Page(BaseModel, Generic[T]):
    """One page of a list; pass ``next_cursor`` back as ``cursor`` for the next page."""

    items: list[T]
    next_cursor: str | None = None


class ErrorResponse(BaseModel):
    """Every error response: one message, plus the failing fields for a 422."""

    detail: str
    errors: list[dict[str, Any]] | None = None


class Scope(str, Enum):
    """Token scopes; each one includes the ones before it (admin ⊇ write ⊇ read)."""

    read = "read"
    write = "write"
    admin = "admin"


class VersionStatus(str, Enum):
    """A version's lifecycle: ``draft`` → ``published`` or ``aborted``."""

    draft = "draft"
    published = "published"
    aborted = "aborted"


class RunStatus(str, Enum):
    """A run's status, set by its owner."""

    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


# --- datasets -------------------------------------------------------------------------


class DatasetCreate(_Model):
    """Create a dataset: a unique name, a description and an owner."""

    name: Name
    description: Text = ""
    owner: Annotated[str, Field(max_length=256), AfterValidator(_check_text)] = ""


class DatasetPublic(_Public):
    """A dataset as the server returns it."""

    name: str
    description: str
    owner: str
    created_at: datetime
    num_versions: int = 0
    latest_published: int | None = None


# --- versions and shards --------------------------------------------------------------


class VersionCreate(_Model):
    """Open a draft version.

    ``storage_root`` is the URL (``s3://bucket/prefix``, ``file:///dir``) under which the
    shard keys live; omitted, the server assigns one under its own storage root.
    """

    columns: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=256)]]
    storage_root: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    builder_config: JSONObject = Field(default_factory=dict)
    lineage: JSONObject = Field(default_factory=dict)


class VersionUpdate(_Model):
    """Change a draft before its shards are registered (unset fields stay as they are).

    The builder opens its draft before building (so a failed build leaves an aborted
    draft) and fills in the columns and storage root once the build knows them.
    """

    columns: (
        dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=256)]] | None
    ) = None
    storage_root: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    builder_config: JSONObject | None = None
    lineage: JSONObject | None = None


class ShardRecord(_Model):
    """One shard of a version.

    ``key`` is relative to the version's storage root and is the object actually stored
    (the compressed file when ``compression`` is set); ``stored_bytes`` is its size, checked
    at publish. ``mds`` optionally carries the shard's ``index.json`` entry verbatim.
    """

    index: Count
    key: ShardKey
    samples: Count
    raw_bytes: Count
    stored_bytes: Count
    compression: Annotated[str, Field(max_length=64)] | None = None
    hashes: dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict)
    )
    mds: JSONObject | None = None


class ShardBatch(_Model):
    """A batch of shards appended to a draft; indexes continue from the draft's count."""

    shards: Annotated[list[ShardRecord], Field(min_length=1, max_length=MAX_SHARDS_PER_BATCH)]


class ShardBatchResult(BaseModel):
    """What the draft holds after a batch was added."""

    num_shards: int
    total_samples: int
    total_bytes: int


class VersionPublic(_Public):
    """A version as the server returns it; published versions never change."""

    id: int
    dataset: str
    number: int
    status: VersionStatus
    columns: dict[str, str]
    storage_root: str
    builder_config: dict[str, Any]
    lineage: dict[str, Any]
    created_by: str
    created_at: datetime
    published_at: datetime | None = None
    num_shards: int
    total_samples: int
    total_bytes: int
    total_raw_bytes: int


# --- presigned URLs -------------------------------------------------------------------


class PresignRequest(_Model):
    """Ask for short-lived GET URLs for some of a published version's shard keys."""

    keys: Annotated[list[ShardKey], Field(min_length=1, max_length=MAX_PRESIGN_KEYS)]
    expires_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] | None = None


class PresignResponse(BaseModel):
    """Shard key → URL; the URLs stop working at ``expires_at``."""

    urls: dict[str, str]
    expires_at: datetime


# --- runs and checkpoints -------------------------------------------------------------


class RunSource(_Model):
    """One published version a run reads, with its mixture weight."""

    dataset: Name
    version: Annotated[int, Field(ge=1, le=_MAX_INT)]
    weight: Annotated[float, Field(gt=0, le=1e12)] = 1.0


class RunCreate(_Model):
    """Register a training run reading one or more published versions."""

    name: Name | None = None
    sources: Annotated[list[RunSource], Field(min_length=1, max_length=256)]
    seed: Annotated[int, Field(ge=0, le=_MAX_INT)] = 0
    global_batch_size: Annotated[int, Field(ge=1, le=_MAX_INT)]
    plan: JSONObject = Field(default_factory=dict)


class RunUpdate(_Model):
    """Change a run's status."""

    status: RunStatus


class RunPublic(_Public):
    """A run as the server returns it."""

    id: int
    name: str | None
    sources: list[RunSource]
    seed: int
    global_batch_size: int
    plan: dict[str, Any]
    status: RunStatus
    created_by: str
    created_at: datetime
    updated_at: datetime


class CheckpointCreate(_Model):
    """A run's data position at a training step."""

    step: Count
    epoch: Count
    sample_in_epoch: Count
    plan: JSONObject = Field(default_factory=dict)


class CheckpointPublic(_Public):
    """A committed checkpoint."""

    run_id: int
    step: int
    epoch: int
    sample_in_epoch: int
    plan: dict[str, Any]
    created_at: datetime


# --- tokens ---------------------------------------------------------------------------


class TokenCreate(_Model):
    """Create an API token; ``datasets`` restricts it to those datasets (None: all)."""

    name: Name
    scopes: Annotated[list[Scope], Field(min_length=1, max_length=3)]
    datasets: Annotated[list[Name], Field(max_length=1000)] | None = None
    expires_at: datetime | None = None


class TokenPublic(_Public):
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


class Health(BaseModel):
    """Liveness / readiness answer."""

    status: Literal["ok", "unavailable"]
    detail: str = ""


__all__ = [
    "MAX_PRESIGN_KEYS",
    "MAX_SHARDS_PER_BATCH",
    "NAME_PATTERN",
    "CheckpointCreate",
    "CheckpointPublic",
    "DatasetCreate",
    "DatasetPublic",
    "ErrorResponse",
    "Health",
    "Page",
    "PresignRequest",
    "PresignResponse",
    "RunCreate",
    "RunPublic",
    "RunSource",
    "RunStatus",
    "RunUpdate",
    "Scope",
    "ShardBatch",
    "ShardBatchResult",
    "ShardRecord",
    "TokenCreate",
    "TokenPublic",
    "VersionCreate",
    "VersionPublic",
    "VersionStatus",
    "VersionUpdate",
    "check_name",
    "check_shard_key",
]
