"""The node-local shard cache: one download per shard per node, LRU within a size limit.

Every rank and DataLoader worker of a node opens the same cache directory; they
coordinate through the file system only (``flock`` and atomic renames, no shared memory,
no barriers), so processes may come, go, fork or be SIGKILLed at any moment.

>>> cache = ShardCache(Path("/local/cache"), limit_bytes=200 << 30)
>>> with cache.lease("v1/shard.00000.mds", fetch, size=67_108_864) as path:
...     reader = ShardReader(path)

How a lease works (see ``docs/cache.md`` for the full story):

* **hit**: open ``data/<name>``, take a shared ``flock`` on it (the *pin*: eviction needs
  an exclusive one), ``fstat``. The pin lasts until the lease is released.
* **miss**: take the shard's download lock (``locks/<name>.dl``, exclusive, blocking), so
  exactly one process downloads while the others wait and then find the file. The
  downloader reserves the size (evicting least recently used, unpinned shards), calls
  ``fetch(tmp)`` to write the verified, uncompressed bytes into a private ``tmp/``
  folder, pins the result and renames it into ``data/``: readers see the whole shard or
  nothing, and it is pinned from the instant it appears.

Module layout: :mod:`~shardstream.client.cache_keys` (names and folders),
:mod:`~shardstream.client.cache_space` (limit, scans, eviction),
:mod:`~shardstream.client._filelock` (the locks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import stat
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from shardstream.client._filelock import lock_path, pin_file, unlink_and_close
from shardstream.client.cache_keys import CacheLayout, key_to_name, leaf_name
from shardstream.client.cache_space import CacheSpace
from shardstream.errors import ConfigError, CorruptShardError

__all__ = ["CacheStats", "Fetch", "ShardCache", "ShardLease"]

log = logging.getLogger(__name__)

Fetch = Callable[[Path], None]
"""Writes the final (verified, uncompressed) bytes of a shard to the path it is given."""


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


class ShardLease:
    """A pinned, cached shard: ``path`` is not evicted until :meth:`release`.

    Usable as a context manager. After release the file may be evicted (unlinked), but
    memory maps and open descriptors of it stay valid: they hold the inode.
    """

    __slots__ = ("_fd", "key", "path", "size")

    def __init__(self, key: str, path: Path, fd: int, size: int) -> None:
        self.key = key
        self.path = path
        self.size = size
        self._fd: int | None = fd

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._fd is None

    def release(self) -> None:
        """Unpin the shard (idempotent). Closing, not LOCK_UN: see ``_filelock``."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

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
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"ShardLease({self.key!r}, {state})"


class _ProcessState:
    """Per-process mutable state, recreated after a fork (stats are per process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stats = CacheStats()
        self.warned_over_limit = False


# Every live cache, so a forked child can give each one fresh per-process state.
_CACHES: weakref.WeakSet[ShardCache] = weakref.WeakSet()
# key -> (file name, data path) of recent keys; the hot path skips escaping and Path().
_NAME_CACHE_SIZE = 65536


class ShardCache:
    """A node-wide shard cache in ``root``, optionally bounded by ``limit_bytes``.

    ``limit_bytes`` None means unbounded. A single shard larger than the limit is a
    ConfigError (the limit must hold at least every shard open at once). The limit is
    exceeded only when every cached shard is pinned by a lease; that logs one warning per
    process. ``rescan_interval_s`` bounds how long the shared size hint is trusted
    without a directory scan; ``touch_interval_s`` how often a hit refreshes a shard's
    ``mtime`` (its LRU age). Safe to share between threads and across ``fork``.
    """

    def __init__(
        self,
        root: Path | str,
        limit_bytes: int | None = None,
        *,
        rescan_interval_s: float = 60.0,
        touch_interval_s: float = 1.0,
    ) -> None:
        if limit_bytes is not None and (not isinstance(limit_bytes, int) or limit_bytes < 1):
            raise ConfigError(
                f"cache limit_bytes must be a positive int or None, got {limit_bytes!r}"
            )
        self._layout = CacheLayout(Path(root).expanduser().absolute())
        self._layout.create()
        self._space = CacheSpace(self._layout, limit_bytes, rescan_interval_s)
        self._touch_ns = int(touch_interval_s * 1e9)
        self._state = _ProcessState()
        self._names: dict[str, tuple[str, Path]] = {}
        _CACHES.add(self)
        try:
            swept = self._space.sweep()
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EACCES):
                raise
            raise ConfigError(
                f"cannot lock files in cache directory {self.root} ({exc.strerror}); it must be "
                "a writable local file system with flock (not NFS): set SHARDSTREAM_CACHE_DIR"
            ) from exc
        if swept:
            log.info(
                "shard cache %s: removed %d downloads left by dead processes", self.root, swept
            )

    @property
    def root(self) -> Path:
        """The cache directory."""
        return self._layout.root

    @property
    def limit_bytes(self) -> int | None:
        """The size limit (None: unbounded)."""
        return self._space.limit_bytes

    def stats(self) -> CacheStats:
        """A snapshot of this process's counters."""
        state = self._state
        with state.lock:
            return dataclasses.replace(state.stats)

    def usage_bytes(self) -> int:
        """Bytes cached on this node now, plus downloads in flight (a directory scan)."""
        return self._space.total()

    def path(self, key: str) -> Path:
        """Where ``key`` lives when cached (no lease: it may vanish at any time)."""
        return self._resolve(key)[1]

    def contains(self, key: str) -> bool:
        """Whether ``key`` is cached right now (a hint: it may be evicted next moment)."""
        return self.path(key).exists()

    @contextmanager
    def lease(self, key: str, fetch: Fetch, *, size: int) -> Iterator[Path]:
        """Pin ``key`` for the ``with`` block, downloading it first if needed.

        ``fetch(tmp)`` runs in at most one process per node at a time per key; it must
        write exactly ``size`` bytes (the final, uncompressed shard) to ``tmp``.
        """
        held = self.acquire(key, fetch, size=size)
        try:
            yield held.path
        finally:
            held.release()

    def prefetch(self, key: str, fetch: Fetch, *, size: int) -> bool:
        """Make sure ``key`` is cached without holding it; True if this call downloaded it."""
        held, downloaded = self._acquire(key, fetch, size)
        held.release()
        return downloaded

    def acquire(self, key: str, fetch: Fetch, *, size: int) -> ShardLease:
        """Like :meth:`lease`, returning a :class:`ShardLease` to release explicitly."""
        return self._acquire(key, fetch, size)[0]

    def _acquire(self, key: str, fetch: Fetch, size: int) -> tuple[ShardLease, bool]:
        """(the pinned shard, whether this call downloaded it)."""
        name, data = self._names.get(key) or self._resolve(key)
        limit = self._space.limit_bytes
        if not isinstance(size, int) or size < 0:
            raise ConfigError(f"shard {key!r}: size must be a byte count >= 0, got {size!r}")
        if limit is not None and size > limit:
            raise ConfigError(
                f"shard {key!r} is {size} bytes, larger than the whole cache limit of {limit} "
                "bytes; raise the cache limit (CacheOptions.limit_bytes) to several shards"
            )
        pinned = pin_file(data)
        if pinned is not None:
            _check_cached_size(pinned, key, data, size)
            self._touch(*pinned)
            with self._state.lock:
                self._state.stats.hits += 1
            return ShardLease(key, data, pinned[0], size), False
        self._count(misses=1)
        return self._download(key, name, data, fetch, size)

    def _download(
        self, key: str, name: str, data: Path, fetch: Fetch, size: int
    ) -> tuple[ShardLease, bool]:
        """The miss path: one downloader per shard per node, the others wait and reuse."""
        lock = self._layout.download_lock(name)
        lock_fd = lock_path(lock, blocking=True)
        assert lock_fd is not None  # blocking
        try:
            pinned = pin_file(data)
            if pinned is not None:  # another process finished it while we waited
                _check_cached_size(pinned, key, data, size)
                self._count(waits=1)
                return ShardLease(key, data, pinned[0], size), False
            res = self._space.reserve(name, size, os.getpid())
            self._count(
                evictions=res.evicted, bytes_evicted=res.evicted_bytes, scans=int(res.scanned)
            )
            if res.over_limit:
                self._warn_over_limit(key, size)
            fd = -1
            try:
                target = res.tmp_dir / leaf_name(key)
                fetch(target)
                fd, st = _pin_new(target, key, size)
                os.rename(target, data)
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                self._space.release(res.tmp_dir, size)
                raise
            shutil.rmtree(res.tmp_dir, ignore_errors=True)
            self._count(downloads=1, bytes_downloaded=size)
            return ShardLease(key, data, fd, st.st_size), True
        finally:
            unlink_and_close(lock_fd, lock)

    def _touch(self, fd: int, st: os.stat_result) -> None:
        """Refresh the LRU age, at most once per ``touch_interval_s`` per shard."""
        if time.time_ns() - st.st_mtime_ns > self._touch_ns:
            # OSError: e.g. another user's file; the LRU age is advisory.
            with contextlib.suppress(OSError):
                os.utime(fd)

    def _warn_over_limit(self, key: str, size: int) -> None:
        state = self._state
        self._count(over_limit=1)
        if not state.warned_over_limit:
            state.warned_over_limit = True
            log.warning(
                "shard cache %s is over its limit of %d bytes: every cached shard is in use, so "
                "%r (%d bytes) is stored beyond it (warned once per process); raise the limit or "
                "hold fewer shards open at once",
                self.root,
                self._space.limit_bytes,
                key,
                size,
            )

    def _resolve(self, key: str) -> tuple[str, Path]:
        """(file name, data path) of ``key``, validated; remembered for the hot path."""
        entry = (name := key_to_name(key)), self._layout.data_path(name)
        if len(self._names) >= _NAME_CACHE_SIZE:
            self._names.clear()
        self._names[key] = entry
        return entry

    def _after_fork(self) -> None:
        # The child's counters start at zero, and a lock held by another thread of the
        # parent at fork time would never be released in the child.
        self._state = _ProcessState()

    def _count(self, **deltas: int) -> None:
        state = self._state
        with state.lock:
            for field, delta in deltas.items():
                setattr(state.stats, field, getattr(state.stats, field) + delta)


def _reset_after_fork() -> None:
    for cache in list(_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _check_cached_size(pinned: tuple[int, os.stat_result], key: str, data: Path, size: int) -> None:
    """A cached file of another size is another shard under the same key: refuse it."""
    fd, st = pinned
    if st.st_size != size:
        os.close(fd)
        raise CorruptShardError(
            f"shard {key!r}: the cache holds {st.st_size} bytes at {data} but the lease "
            f"declared size={size}; cache keys must name immutable content (include the "
            "version id), or the declared size is wrong"
        )


def _pin_new(target: Path, key: str, size: int) -> tuple[int, os.stat_result]:
    """Pin the freshly fetched file before it becomes visible, and check its size."""
    pinned = pin_file(target)
    if pinned is None:
        raise CorruptShardError(
            f"shard {key!r}: the fetch callback returned without writing {target}; it must "
            "write the final shard bytes to the path it is given"
        )
    fd, st = pinned
    if not stat.S_ISREG(os.lstat(target).st_mode):
        os.close(fd)
        raise CorruptShardError(
            f"shard {key!r}: the fetch callback left a link or special file at {target}; it "
            "must write a regular file (the cache renames it into place)"
        )
    if st.st_size != size:
        os.close(fd)
        raise CorruptShardError(
            f"shard {key!r}: the fetch wrote {st.st_size} bytes but the lease declared "
            f"size={size}; pass the uncompressed shard size (raw_data.bytes in index.json)"
        )
    return fd, st
