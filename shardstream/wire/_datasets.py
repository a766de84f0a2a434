"""Datasets, their versions, the shard index and presigned shard URLs."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, Field, field_validator

from ._fields import (
    MAX_INT,
    Count,
    JSONObject,
    Label,
    Name,
    PublicModel,
    ShardKey,
    StrictModel,
    Text,
)

MAX_SHARDS_PER_BATCH = 5000
MAX_PRESIGN_KEYS = 1000
MAX_COLUMNS = 4096
MAX_HASHES = 8

# Column name -> encoding (MDS): printable labels, a bounded number of them.
Columns = Annotated[dict[Label, Label], Field(max_length=MAX_COLUMNS)]


# --- datasets -------------------------------------------------------------------------


def _server_sets_owner(value: str) -> str:
    if value:
        raise ValueError(
            "a dataset's owner is set by the server from the calling token; omit 'owner'"
        )
    return value


class DatasetCreate(StrictModel):
    """Create a dataset: a unique name and a description.

    The owner is the calling token's name, set by the server; ``owner`` is accepted only
    empty (older SDKs send ``""``), any other value is refused.
    """

    name: Name
    description: Text = ""
    owner: Annotated[str, Field(max_length=256), AfterValidator(_server_sets_owner)] = ""


class DatasetPublic(PublicModel):
    """A dataset as the server returns it."""

    name: str
    description: str
    owner: str
    created_at: datetime
    num_versions: int = 0
    latest_published: int | None = None


# --- versions and shards --------------------------------------------------------------


class VersionStatus(str, Enum):
    """A version's lifecycle: ``draft`` → ``published`` or ``aborted``."""

    draft = "draft"
    published = "published"
    aborted = "aborted"


class VersionCreate(StrictModel):
    """Open a draft version.

    ``storage_root`` is where the shard keys live. Leave it out: the server places the
    version under the dataset's own location and returns it. Naming one registers
    existing shards in place, which only admin tokens may do, inside the server's
    configured storage roots (403 for other tokens).
    """

    columns: Columns
    storage_root: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    builder_config: JSONObject = Field(default_factory=dict)
    lineage: JSONObject = Field(default_factory=dict)


class VersionUpdate(StrictModel):
    """Change a draft before its shards are registered (unset fields stay as they are).

    The builder opens its draft before building (so a failed build leaves an aborted
    draft) and fills in the columns and storage root once the build knows them.
    """

    columns: Columns | None = None
    storage_root: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    builder_config: JSONObject | None = None
    lineage: JSONObject | None = None


class ShardRecord(StrictModel):
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
    compression: Annotated[Label, Field(max_length=64)] | None = None
    hashes: Annotated[
        dict[Annotated[Label, Field(max_length=32)], Label], Field(max_length=MAX_HASHES)
    ] = Field(default_factory=dict)
    mds: JSONObject | None = None


class ShardBatch(StrictModel):
    """A batch of shards appended to a draft; indexes continue from the draft's count."""

    shards: Annotated[list[ShardRecord], Field(min_length=1, max_length=MAX_SHARDS_PER_BATCH)]

    @field_validator("shards")
    @classmethod
    def _totals_fit(cls, shards: list[ShardRecord]) -> list[ShardRecord]:
        # Each count fits 2**62, their sum may not: a version's totals are 64-bit columns.
        for field in ("samples", "raw_bytes", "stored_bytes"):
            if sum(getattr(s, field) for s in shards) > MAX_INT:
                raise ValueError(
                    f"the batch's total {field} exceeds {MAX_INT} (2**62); a version's "
                    "totals must fit a 64-bit integer"
                )
        return shards


class ShardBatchResult(BaseModel):
    """What the draft holds after a batch was added."""

    num_shards: int
    total_samples: int
    total_bytes: int


class VersionPublic(PublicModel):
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


class PresignRequest(StrictModel):
    """Ask for short-lived GET URLs for some of a published version's shard keys."""

    keys: Annotated[list[ShardKey], Field(min_length=1, max_length=MAX_PRESIGN_KEYS)]
    expires_s: Annotated[int, Field(ge=1, le=7 * 24 * 3600)] | None = None


class PresignResponse(BaseModel):
    """Shard key → URL; the URLs stop working at ``expires_at``."""

    urls: dict[str, str]
    expires_at: datetime
