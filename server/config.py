"""Server settings, read from ``SHARDSTREAM_*`` environment variables.

Settings are never built at import time: :func:`get_settings` builds them once and caches
them, and the app serves them through a dependency that tests override. Unsafe
combinations refuse to start with a message naming the setting (:meth:`Settings.check_safe`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shardstream.errors import ConfigError

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
        description="where drafts without a storage root put their shards; default data_dir/shards",
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
    log_level: str = "INFO"
    log_json: bool = True

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

    @property
    def resolved_storage_root(self) -> str:
        """The default storage root for drafts that name none."""
        if self.storage_root:
            return self.storage_root.rstrip("/")
        return (self.data_dir.expanduser().resolve() / "shards").as_uri()

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
