"""The wire schema: pydantic models shared by the metadata server and the SDK.

One schema family per entity (``ThingCreate`` for requests, ``ThingPublic`` for responses),
separate from the server's table models, so the server and every client agree on one
definition. Importing this package needs only pydantic (no server extra).

Validation that protects the server lives here too: names match
``[a-z0-9][a-z0-9._-]{0,127}``, shard keys are relative ``/``-separated paths that can
never escape a version's storage root, text refuses NUL and lone surrogates, timestamps are
normalized to UTC, and free-form JSON documents are bounded in size and depth
(:class:`FieldLimits`, set by the server from its settings).

Import everything from here; the private modules hold the field types and validators
(``_fields``, ``_json``), datasets, versions, shards and presigned URLs (``_datasets``), runs and
checkpoints (``_runs``), a run's plan parameters (``_plan_params``), the bounds on what a
run's plans, positions and attempts may carry (``_run_bounds``), a run's mixture over
training (``_mixture``), tokens (``_tokens``) and the entity-less responses (``_responses``).
"""

from __future__ import annotations

from ._datasets import (
    MAX_PRESIGN_KEYS,
    MAX_SHARDS_PER_BATCH,
    DatasetCreate,
    DatasetPublic,
    PresignRequest,
    PresignResponse,
    ShardBatch,
    ShardBatchResult,
    ShardRecord,
    VersionCreate,
    VersionPublic,
    VersionStatus,
    VersionUpdate,
)
from ._fields import MAX_INT, NAME_PATTERN, check_name, check_shard_key
from ._input_stats import (
    COUNTS,
    DEFAULT_RANKS,
    INPUT_BOUND,
    LATENCY_BUCKETS_S,
    MAX_HISTORY,
    MAX_MISSING_LISTED,
    MAX_RANKS,
    MAX_WORLD_SIZE,
    SECONDS,
    InputFigures,
    InputStatsReport,
    RankInputStats,
    RunInputStats,
    RunInputSummary,
    Verdict,
    percentiles,
    saturated,
)
from ._json import FieldLimits, check_json_document, field_limits, set_field_limits
from ._mixture import (
    MAX_MIXTURE_WINDOWS,
    MixtureWindow,
    RunMixtureHistory,
    phase_end_text,
    token_count_text,
)
from ._plan_params import PLAN_CONFIG_FIELDS, PlanParams, SourceMixture, stored_plan_params
from ._responses import ErrorResponse, Health, Page
from ._run_bounds import (
    MAX_ATTEMPT_CHANGES,
    MAX_ATTEMPT_CHANGES_BYTES,
    MAX_EPOCH_SAMPLES,
    MAX_EPOCHS,
    MAX_SCHEDULE_PHASES,
    MAX_SCHEDULE_PIECES,
    MAX_STEPS,
    MAX_TOKENS,
    check_plan_bounds,
)
from ._runs import (
    AttemptCreate,
    AttemptPublic,
    CheckpointCreate,
    CheckpointPublic,
    ResumePoint,
    RunCreate,
    RunPublic,
    RunSource,
    RunStatus,
    RunUpdate,
)
from ._tokens import Scope, TokenCreate, TokenPublic

__all__ = [
    "COUNTS",
    "DEFAULT_RANKS",
    "INPUT_BOUND",
    "LATENCY_BUCKETS_S",
    "MAX_ATTEMPT_CHANGES",
    "MAX_ATTEMPT_CHANGES_BYTES",
    "MAX_EPOCHS",
    "MAX_EPOCH_SAMPLES",
    "MAX_HISTORY",
    "MAX_INT",
    "MAX_MISSING_LISTED",
    "MAX_MIXTURE_WINDOWS",
    "MAX_PRESIGN_KEYS",
    "MAX_RANKS",
    "MAX_SCHEDULE_PHASES",
    "MAX_SCHEDULE_PIECES",
    "MAX_SHARDS_PER_BATCH",
    "MAX_STEPS",
    "MAX_TOKENS",
    "MAX_WORLD_SIZE",
    "NAME_PATTERN",
    "PLAN_CONFIG_FIELDS",
    "SECONDS",
    "AttemptCreate",
    "AttemptPublic",
    "CheckpointCreate",
    "CheckpointPublic",
    "DatasetCreate",
    "DatasetPublic",
    "ErrorResponse",
    "FieldLimits",
    "Health",
    "InputFigures",
    "InputStatsReport",
    "MixtureWindow",
    "Page",
    "PlanParams",
    "PresignRequest",
    "PresignResponse",
    "RankInputStats",
    "ResumePoint",
    "RunCreate",
    "RunInputStats",
    "RunInputSummary",
    "RunMixtureHistory",
    "RunPublic",
    "RunSource",
    "RunStatus",
    "RunUpdate",
    "Scope",
    "ShardBatch",
    "ShardBatchResult",
    "ShardRecord",
    "SourceMixture",
    "TokenCreate",
    "TokenPublic",
    "Verdict",
    "VersionCreate",
    "VersionPublic",
    "VersionStatus",
    "VersionUpdate",
    "check_json_document",
    "check_name",
    "check_plan_bounds",
    "check_shard_key",
    "field_limits",
    "percentiles",
    "phase_end_text",
    "saturated",
    "set_field_limits",
    "stored_plan_params",
    "token_count_text",
]
