"""``StorageOptions``: the knobs of every backend, as one frozen, validated value object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shardstream.errors import ConfigError

MiB = 1 << 20

# S3 rejects multipart parts below 5 MiB (except the last), whatever part_size says.
S3_MIN_UPLOAD_PART = 5 * MiB
S3_MAX_PARTS = 10_000


@dataclass(frozen=True)
class StorageOptions:
    """How a store talks to its backend.

    Every field left at ``None`` falls back to the standard AWS settings (environment
    variables such as ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``,
    and ``~/.aws/config``), which boto3 reads itself.

    >>> StorageOptions(max_connections=4, part_size=16 << 20).part_size
    16777216
    """

    endpoint_url: str | None = None
    """S3-compatible endpoint (MinIO, moto, R2...); ``None``: AWS_ENDPOINT_URL or AWS."""
    region: str | None = None
    """Region name; ``None``: AWS_DEFAULT_REGION / the AWS config."""
    access_key_id: str | None = None
    """Explicit credentials; ``None``: the standard AWS credential chain."""
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    max_connections: int = 32
    """Most concurrent requests of the process (every store with the same bounds shares
    one adaptive limit): concurrency grows from ``min_connections`` towards this while
    throughput grows, and halves on throttling (see ``docs/storage.md``)."""
    min_connections: int = 4
    """Concurrency the adaptive limit never goes below (capped at ``max_connections``)."""
    start_connections: int = 16
    """Concurrency the adaptive limit starts at (kept between the two bounds). A cold
    reader's first batch needs many small ranged reads at once; 16 is far below what one
    S3 prefix accepts, and the limit halves on the first throttling answer anyway."""
    part_size: int = 16 * MiB
    """Objects larger than this are fetched as parallel ranged GETs of this size, and
    uploaded as multipart (parts at least 5 MiB, as S3 requires)."""
    retries: int = 6
    """Attempts per request (and per part) before a transient failure is raised."""
    backoff_base_s: float = 0.2
    """First backoff; attempt n sleeps uniformly in [0, min(backoff_max_s, base * 2**n)]."""
    backoff_max_s: float = 20.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    """Seconds without a byte from the server before the request counts as stalled."""
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """S3 bucket addressing: ``auto``, ``path`` or ``virtual``."""

    def __post_init__(self) -> None:
        _at_least("max_connections", self.max_connections, 1)
        _at_least("min_connections", self.min_connections, 1)
        _at_least("start_connections", self.start_connections, 1)
        _at_least("part_size", self.part_size, 64 << 10)
        _at_least("retries", self.retries, 1)
        for name in ("backoff_base_s", "backoff_max_s"):
            _at_least(name, getattr(self, name), 0.0)
        for name in ("connect_timeout_s", "read_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"StorageOptions.{name} must be > 0, got {getattr(self, name)!r}")
        if self.addressing_style not in ("auto", "path", "virtual"):
            raise ConfigError(
                f"StorageOptions.addressing_style must be 'auto', 'path' or 'virtual', "
                f"got {self.addressing_style!r}"
            )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError(
                "StorageOptions: set both access_key_id and secret_access_key, or neither "
                "(to use the standard AWS credential chain)"
            )


def _at_least(name: str, value: float, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ConfigError(f"StorageOptions.{name} must be a number >= {low}, got {value!r}")
