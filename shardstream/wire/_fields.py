"""Field types and their validators, and the two bases every wire model builds on.

Names match ``[a-z0-9][a-z0-9._-]{0,127}``; shard keys are relative ``/``-separated paths
that can never escape a version's storage root; text and JSON refuse what PostgreSQL cannot
store (NUL characters, lone surrogates, NaN and infinities); free-form JSON documents are
bounded in size and depth (:mod:`._json`); timestamps are normalized to UTC.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo

from ._json import check_json_document, check_plan_numbers, text_problem

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)
MAX_INT = 2**62  # fits a signed 64-bit column with room to spare
MAX_KEY_LENGTH = 1024


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
    problem = text_problem(key)  # a lone surrogate can be neither stored nor signed
    if problem:
        raise ValueError(f"shard key: {problem}")
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


def check_text(value: str) -> str:
    """Return ``value`` unless it holds a NUL character or a lone surrogate (ValueError)."""
    # PostgreSQL text cannot hold NUL, and no database driver can encode a lone UTF-16
    # surrogate (JSON may carry "\ud800" escaped); refuse both here, naming the field.
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def check_label(value: str) -> str:
    """Return ``value`` if it is a short printable label (a column name or type, a hash
    name), else raise ValueError: no control characters, NUL or lone surrogates."""
    check_text(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{value[:60]!r} must not contain control characters")
    return value


def _check_json(value: Any, info: ValidationInfo) -> Any:
    """Refuse JSON documents over the size or depth limit, or that a database cannot
    store (NaN/inf, NUL characters, lone surrogates); see :mod:`._json`."""
    return check_json_document(value, what=info.field_name or "document")


def _check_plan(value: Any, info: ValidationInfo) -> Any:
    """A JSON document (:func:`_check_json`) whose numbers are within ±2**64."""
    what = info.field_name or "plan"
    return check_plan_numbers(check_json_document(value, what=what), what=what)


def utc_timestamp(value: datetime) -> datetime:
    """``value`` as timezone-aware UTC (naive means UTC), or ValueError when the instant
    falls outside years 1-9999 in UTC (``9999-12-31T23:59:59-05:00`` does)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(
            f"{value.isoformat()} is outside the range a server can store (years 1-9999 in UTC)"
        ) from None


Name = Annotated[
    str,
    Field(min_length=1, max_length=128, json_schema_extra={"pattern": NAME_PATTERN}),
    AfterValidator(check_name),
]
ShardKey = Annotated[str, AfterValidator(check_shard_key)]
Text = Annotated[str, Field(max_length=10_000), AfterValidator(check_text)]
Label = Annotated[str, Field(max_length=256), AfterValidator(check_label)]
JSONObject = Annotated[dict[str, Any], AfterValidator(_check_json)]
PlanObject = Annotated[dict[str, Any], AfterValidator(_check_plan)]
"""A run's or a checkpoint's reader plan: a JSON object whose numbers fit ±2**64."""
UTCTimestamp = Annotated[datetime, AfterValidator(utc_timestamp)]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]


class StrictModel(BaseModel):
    """Base of requests (and shard records): unknown fields and NaN/inf are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class PublicModel(BaseModel):
    """Base of responses read from table rows."""

    # Responses ignore unknown fields so an older SDK keeps working against a newer server.
    model_config = ConfigDict(from_attributes=True, extra="ignore")
