"""Server settings, read from ``SHARDSTREAM_*`` environment variables.

Settings are never built at import time: :func:`get_settings` builds them once and caches
them, and the app serves them through a dependency that tests override. Unsafe
combinations refuse to start with a message naming the setting (:meth:`Settings.check_safe`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shardstream.errors import ConfigError
from shardstream.server.logs import LogFormat

if TYPE_CHECKING:
    from shardstream.server.storage.locations import Location

DEFAULT_PORT = 8470
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Settings(BaseSettings):
    """Everything the server can be configured with (environment prefix ``SHARDSTREAM_``)."""

    model_config = SettingsConfigDict(env_prefix="SHARDSTREAM_", extra="ignore")

    data_dir: Path = Field(
        default_factory=lambda: Path.home() / ".local" / "share" / "shardstream",
        description="directory for the default SQLite database and local shards",
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default: sqlite file in data_dir"
    )
    storage_root: str | None = Field(
        default=None,
        description="the storage root new datasets are placed under (s3://bucket/prefix or "
        "a local directory); default: the first of storage_roots, else data_dir/shards",
    )
    storage_roots: str | None = Field(
        default=None,
        description="comma-separated storage roots the server may use (s3:// or local "
        "directories); datasets live only under these (see docs/server.md, Security)",
    )
    storage_deadline_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="longest a publish may spend checking shards in storage (503 after)",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    workers: int = Field(default=1, ge=1, le=256)
    admin_token: SecretStr | None = Field(default=None, description="bootstrap admin secret")
    presign_expires_s: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    s3_public_endpoint_url: str | None = Field(
        default=None,
        description="S3 endpoint that clients reach, used to sign presigned URLs when the "
        "server itself talks to the store at another address (AWS_ENDPOINT_URL)",
    )
    token_cache_s: float = Field(
        default=5.0, ge=0, le=3600, description="how long an authenticated token is cached"
    )
    version_cache_s: float = Field(
        default=5.0,
        ge=0,
        le=3600,
        description="how long a published version is served from memory before it is "
        "checked again (a dataset deleted through another replica disappears after this)",
    )
    migrate_on_start: bool = True
    db_pool_size: int = Field(default=16, ge=1, le=1000)
    read_slots: int = Field(
        default=16,
        ge=0,
        le=100_000,
        description="reads a server process works on at once, the others wait (0: no bound; "
        "server/priority.py)",
    )
    # Request and database limits (docs/server.md, "Request and database limits").
    max_body_bytes: int = Field(
        default=8 << 20, ge=1024, description="largest request body (413 above it)"
    )
    max_shard_batch_bytes: int = Field(
        default=64 << 20,
        ge=1024,
        description="largest body of POST .../shards (5,000 shards with their MDS entries)",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="time a client has to send its body (408)"
    )
    # The per-token request budget, per server process (server/budget.py; 429 beyond).
    token_concurrency: int = Field(
        default=64, ge=0, le=100_000, description="requests of one token in flight (0: off)"
    )
    token_busy_s: float = Field(
        default=0.5,
        ge=0,
        le=100_000,
        description="share of a server process one token's requests may keep, in seconds "
        "per second (0: off)",
    )
    token_burst_s: float = Field(
        default=10.0, gt=0, le=86_400, description="server time a token may use in a burst"
    )
    db_connect_timeout_s: int = Field(default=5, ge=1, le=600)
    db_statement_timeout_s: float = Field(
        default=30.0, gt=0, le=86_400, description="PostgreSQL statement_timeout"
    )
    db_lock_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="PostgreSQL lock_timeout, SQLite busy timeout"
    )
    db_pool_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="wait for a free pooled connection (503)"
    )
    db_start_timeout_s: float = Field(
        default=60.0, ge=0, le=86_400, description="how long start-up waits for the database"
    )
    max_json_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 << 20,
        description="largest free-form JSON document per field (a run's plan, builder_config, "
        "lineage, a checkpoint's plan), as UTF-8 JSON (422 above it)",
    )
    max_json_depth: int = Field(
        default=32, ge=2, le=256, description="deepest nesting of objects and arrays in one"
    )
    log_level: str = "INFO"
    log_format: LogFormat = Field(
        default="auto",
        description="text lines for people, or one JSON object per line; auto: text when "
        "stderr is a terminal, JSON otherwise",
    )
    log_json: bool | None = Field(
        default=None, description="the older switch: true is log_format json, false text"
    )
    console: bool = Field(
        default=True, description="serve the web console at /ui (false: the API only)"
    )
    console_session_hours: float = Field(
        default=12.0,
        gt=0,
        le=24 * 30,
        description="a console session ends this long after sign-in, however active",
    )
    console_idle_minutes: float = Field(
        default=60.0,
        gt=0,
        le=24 * 60,
        description="a console session ends after this long without a request",
    )

    @field_validator("admin_token")
    @classmethod
    def _strong_admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 12:
            raise ValueError("SHARDSTREAM_ADMIN_TOKEN must be at least 12 characters long")
        return value

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to ``sqlite:///<data_dir>/shardstream.db``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir.expanduser().resolve() / 'shardstream.db'}"

    @field_validator("storage_root", "storage_roots")
    @classmethod
    def _valid_roots(cls, value: str | None) -> str | None:
        """Canonical root URLs (relative directories made absolute), or a ValueError."""
        if not value:
            return value
        from shardstream.server.storage.locations import LocationError, parse_roots

        items = [item.strip() for item in value.split(",") if item.strip()]
        items = [
            i if "://" in i or i.startswith("/") else Path(i).expanduser().resolve().as_uri()
            for i in items
        ]
        try:
            return ",".join(root.url for root in parse_roots(",".join(items)))
        except LocationError as exc:
            raise ValueError(f"storage root {value!r}: {exc}") from exc

    @property
    def resolved_storage_roots(self) -> tuple[Location, ...]:
        """Every configured storage root, the default root (new datasets) first."""
        from shardstream.server.storage.locations import parse_location, parse_roots

        extra = parse_roots(self.storage_roots or "")
        if self.storage_root:
            first = parse_roots(self.storage_root)[0]
        elif extra:
            first = extra[0]
        else:
            first = parse_location((self.data_dir.expanduser().resolve() / "shards").as_uri())
        return (first, *(r for r in extra if r != first))

    @property
    def resolved_storage_root(self) -> str:
        """The default storage root (where new datasets are placed), as a URL."""
        return self.resolved_storage_roots[0].url

    @property
    def resolved_log_format(self) -> LogFormat:
        """``log_format``, or what the older ``log_json`` asks for when that is auto."""
        if self.log_format == "auto" and self.log_json is not None:
            return "json" if self.log_json else "text"
        return self.log_format

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is an SQLite file (embedded mode)."""
        return self.resolved_database_url.startswith("sqlite")

    def check_safe(self, *, has_db_tokens: bool | None = None) -> None:
        """Raise ConfigError for settings that must not be served.

        * an SQLite database behind several worker processes (SQLite serializes writers
          and each process would also migrate it concurrently): use PostgreSQL;
        * listening on a non-loopback address while no admin token exists at all
          (``has_db_tokens`` False and no ``SHARDSTREAM_ADMIN_TOKEN``): nobody could
          administer the server, and a later bootstrap would race with strangers.
        """
        if self.is_sqlite and self.workers > 1:
            raise ConfigError(
                f"SHARDSTREAM_WORKERS={self.workers} with an SQLite database: SQLite supports "
                "one server process only; use --workers 1 or set SHARDSTREAM_DATABASE_URL to "
                "a postgresql+psycopg:// URL"
            )
        if self.is_sqlite and ":memory:" in self.resolved_database_url:
            raise ConfigError(
                "SHARDSTREAM_DATABASE_URL points to an in-memory SQLite database, which loses "
                "everything on restart; give a file path"
            )
        if self.host not in _LOOPBACK and self.admin_token is None and has_db_tokens is False:
            raise ConfigError(
                f"SHARDSTREAM_HOST={self.host} exposes the server beyond this machine, but no "
                "admin token exists: set SHARDSTREAM_ADMIN_TOKEN or run "
                "'shardstream server create-token --name admin --scopes admin' first"
            )


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Build the settings from the environment once (a FastAPI dependency)."""
    return Settings()
