"""The values the node cache hands out: leases and counters.

Kept apart from the cache's protocol so that each reads in one sitting.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["CacheStats", "ShardLease"]


@dataclass
class CacheStats:
    """What one process did with the cache (counters start at zero in every process)."""

    hits: int = 0
    """Leases that found the shard cached."""
    misses: int = 0
    """Leases that did not; each is a ``download`` or a ``wait``."""
    downloads: int = 0
    """Fetches this process ran to completion."""
    waits: int = 0
    """Misses served by another process's download (we waited on its lock)."""
    bytes_downloaded: int = 0
    evictions: int = 0
    bytes_evicted: int = 0
    scans: int = 0
    """Directory scans (only when the limit is near or the size hint is stale)."""
    over_limit: int = 0
    """Downloads that went over the limit because every other shard was pinned."""
    repaired: int = 0
    """Cached files that failed their check (changed, truncated, zeroed) and were fetched
    again."""


class ShardLease:
    """A pinned, cached shard: ``path`` is not evicted until :meth:`release`.

    Usable as a context manager. After release the file may be evicted (unlinked), but
    memory maps and open descriptors of it stay valid: they hold the inode.
    """

    __slots__ = ("_after", "_fd", "key", "path", "size")

    def __init__(
        self, key: str, path: Path, fd: int, size: int, after: Callable[[], None] | None = None
    ) -> None:
        self.key = key
        self.path = path
        self.size = size
        self._fd: int | None = fd
        self._after = after

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._fd is None

    def release(self) -> None:
        """Unpin the shard (idempotent). Closing, not LOCK_UN: see ``_filelock``."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            if self._after is not None:
                self._after()

    def __enter__(self) -> Path:
        return self.path

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        # A forgotten lease must not leak its pin; at interpreter exit the kernel does it.
        # No eviction from here: the collector may run while this very thread holds the
        # cache's space lock, and taking it again would wait forever.
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"ShardLease({self.key!r}, {state})"
