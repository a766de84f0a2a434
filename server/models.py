"""Table models (SQLAlchemy 2 declarative), separate from the wire schema.

Schema changes go through an alembic migration in ``server/migrations/versions``; a test
checks that the migrations and these models agree.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC and always read back timezone-aware (SQLite drops tz)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    """Declarative base of every table."""

    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime}


class TokenRow(Base):
    """An API token; only the sha256 of its secret is stored."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    prefix: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(64))  # comma-separated
    datasets: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class DatasetRow(Base):
    """A named dataset."""

    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner: Mapped[str] = mapped_column(String(256), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Where the dataset's bytes live (a URL under a configured storage root), chosen by
    # the server at the first draft; None until then (see server/storage/locations.py).
    location: Mapped[str | None] = mapped_column(Text, nullable=True)


class VersionRow(Base):
    """A dataset version: a draft, then published (immutable) or aborted."""

    __tablename__ = "versions"
    __table_args__ = (
        UniqueConstraint("dataset_id", "number", name="uq_versions_dataset_number"),
        # A unique index, not a constraint: SQLite adds one without copying the table.
        Index("ix_versions_dataset_idempotency_key", "dataset_id", "idempotency_key", unique=True),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="draft")
    columns: Mapped[dict[str, Any]] = mapped_column(JSON)
    storage_root: Mapped[str] = mapped_column(Text)
    builder_config: Mapped[dict[str, Any]] = mapped_column(JSON)
    lineage: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    num_shards: Mapped[int] = mapped_column(BigInteger, default=0)
    total_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    total_raw_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # The Idempotency-Key the draft was created with, and a digest of that request's body
    # (a replay with another body is refused); None for drafts created without a key.
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    request_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ShardRow(Base):
    """One shard of a version, at position ``idx``."""

    __tablename__ = "shards"
    __table_args__ = (Index("ix_shards_version_key", "version_id", "key", unique=True),)
    version_id: Mapped[int] = mapped_column(
        ForeignKey("versions.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    key: Mapped[str] = mapped_column(String(1024))
    samples: Mapped[int] = mapped_column(BigInteger)
    raw_bytes: Mapped[int] = mapped_column(BigInteger)
    stored_bytes: Mapped[int] = mapped_column(BigInteger)
    compression: Mapped[str | None] = mapped_column(String(64), nullable=True)
    hashes: Mapped[dict[str, Any]] = mapped_column(JSON)
    mds: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)


class RunRow(Base):
    """A training run."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str | None] = mapped_column(String(128), nullable=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    global_batch_size: Mapped[int] = mapped_column(BigInteger)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="running")
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    latest_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The principal that created the run (``token:<id>``, ``admin`` for the bootstrap
    # secret), set by the server; None for runs from before owners (admins only write them).
    owner: Mapped[str | None] = mapped_column(String(64), nullable=True)


class RunSourceRow(Base):
    """A version a run reads; names are kept even if the version is force-deleted."""

    __tablename__ = "run_sources"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    dataset: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    version_id: Mapped[int | None] = mapped_column(
        ForeignKey("versions.id", ondelete="SET NULL"), nullable=True, index=True
    )
    weight: Mapped[float] = mapped_column(Float)


class CheckpointRow(Base):
    """A run's data position at a step."""

    __tablename__ = "checkpoints"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger)
    sample_in_epoch: Mapped[int] = mapped_column(BigInteger)
    plan: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The attempt (RunAttemptRow.number) that committed it; None for commits of clients
    # that register no attempts (before the ledger).
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The attempt whose rollback to an earlier step abandoned this checkpoint (it is no
    # longer part of the run's history; a commit at its step replaces it); None if live.
    superseded_by: Mapped[int | None] = mapped_column(Integer, nullable=True)


class RunAttemptRow(Base):
    """One start of a run (the ledger): its topology, where it resumed, what it changed.

    ``key`` is chosen by the job (the same on all its ranks), so every rank registers
    the same attempt idempotently; ``number`` counts a run's attempts from 1. A key is
    not unique: a launcher reuses its ids when a job is started again by hand, and such a
    later start is a new attempt under the same key (the newest is the one ranks join).
    """

    __tablename__ = "run_attempts"
    __table_args__ = (
        UniqueConstraint("run_id", "number", name="uq_run_attempts_run_number"),
        Index("ix_run_attempts_run_key", "run_id", "key"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(64))
    world_size: Mapped[int] = mapped_column(BigInteger)
    workers: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The checkpoint it resumed from (step, and the attempt that committed it); None: the
    # run's first start. start_epoch/start_sample: the data position it started at.
    resumed_step: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    resumed_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    start_epoch: Mapped[int] = mapped_column(BigInteger)
    start_sample: Mapped[int] = mapped_column(BigInteger)
    # A rollback: the run's latest step when this attempt resumed from an earlier one.
    rolled_back_from: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    algorithm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Plan changes the resume accepted (ReaderState.changes).
    changes: Mapped[list[Any]] = mapped_column(JSON)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Why its ranks disagreed (a rank registered the key with another start): none of its
    # commits is accepted. None: its ranks agree.
    disputed: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Its commits the server refused, [step, epoch, sample_in_epoch] each (the first
    # MAX_REFUSED): the trainer may have saved a model at such a step all the same.
    refused: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class ConsoleSessionRow(Base):
    """A signed-in console session; only the sha256 of its random id is stored.

    ``binding`` is ``HMAC-SHA256(session id, sha256(secret that signed in))``: the session
    stands for that one secret (a stored token's, or the bootstrap admin secret's, which is
    never stored itself), checked on every request.
    """

    __tablename__ = "console_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # None: signed in with the bootstrap admin secret (SHARDSTREAM_ADMIN_TOKEN).
    token_id: Mapped[int | None] = mapped_column(
        ForeignKey("tokens.id", ondelete="CASCADE"), nullable=True, index=True
    )
    binding: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RankInputStatsRow(Base):
    """One rank's input figures for a run (is training waiting for data?), updated by each
    of its checkpoint commits: the latest window, totals since it first reported, and the
    wait share of its recent commits (``[step, share]`` pairs, bounded)."""

    __tablename__ = "run_input_stats"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    world_size: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(BigInteger)
    verdict: Mapped[str] = mapped_column(String(32))
    wait_share: Mapped[float] = mapped_column(Float)
    latest: Mapped[dict[str, Any]] = mapped_column(JSON)
    total: Mapped[dict[str, Any]] = mapped_column(JSON)
    history: Mapped[list[Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunInputTotalsRow(Base):
    """A run's input figures over all its ranks, kept as its ranks' commits arrive
    (:mod:`~shardstream.server.data.run_input_totals`), so ``/metrics`` reads one row per
    run whatever its world size: the ranks per latest verdict, the largest world size a
    rank reported, and the sums of the ranks' totals that ``/metrics`` exports."""

    __tablename__ = "run_input_totals"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    ranks_unknown: Mapped[int] = mapped_column(Integer, default=0)
    ranks_not_input_bound: Mapped[int] = mapped_column(Integer, default=0)
    ranks_io_bound: Mapped[int] = mapped_column(Integer, default=0)
    ranks_cpu_bound: Mapped[int] = mapped_column(Integer, default=0)
    world_size: Mapped[int] = mapped_column(Integer)
    data_wait_s: Mapped[float] = mapped_column(Float, default=0.0)
    step_s: Mapped[float] = mapped_column(Float, default=0.0)
    storage_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    storage_requests: Mapped[int] = mapped_column(BigInteger, default=0)
    throttled: Mapped[int] = mapped_column(BigInteger, default=0)
    retries: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_hits: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_misses: Mapped[int] = mapped_column(BigInteger, default=0)


class RunMixtureRow(Base):
    """A run's mixture over training (:mod:`~shardstream.server.data.mixture_history`):
    per finished window of ``width`` global steps (window ``i`` is steps ``[i width,
    (i + 1) width)``), the samples each source gave and the schedule's weights over it
    (``[[samples...], [weights...]]``), at most ``MAX_MIXTURE_WINDOWS`` windows."""

    __tablename__ = "run_mixture"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    width: Mapped[int] = mapped_column(BigInteger)
    windows: Mapped[list[Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
