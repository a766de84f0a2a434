"""The node-local shard cache: one download per shard per node, LRU within a size limit.

Every rank and DataLoader worker of a node opens the same cache directory; they
coordinate through the file system only (``flock`` and atomic renames, no shared memory,
no barriers), so processes may come, go, fork or be SIGKILLed at any moment.

>>> cache = ShardCache(Path("/local/cache"), limit_bytes=200 << 30)
>>> with cache.lease("v1/shard.00000.mds", fetch, size=67_108_864) as path:
...     reader = ShardReader(path)

How a lease works (see ``docs/cache.md`` for the full story):

* **hit**: open ``data/<name>``, take a shared ``flock`` on it (the *pin*: eviction needs
  an exclusive one), ``fstat``, and check that the file is still the one whose hash was
  verified (:mod:`~shardstream.client.cache.verify`: a remembered ``fstat`` identity, or the
  shard's verified marker on first use in a process, or else a full hash). A file that
  fails (a flipped byte, truncated, zeroed, edited) is evicted and fetched again, once;
  only a source whose own bytes are wrong raises. The pin lasts until the lease is
  released; releasing it while the cache is over its limit evicts back to the limit.
* **miss**: take the shard's download lock (``locks/<name>.dl``, exclusive, blocking), so
  exactly one process downloads while the others wait and then find the file. The
  downloader reserves the size (evicting least recently used, unpinned shards), calls
  ``fetch(tmp)`` to write the verified, uncompressed bytes into a private ``tmp/``
  folder, pins the result and renames it into ``data/``: readers see the whole shard or
  nothing, and it is pinned from the instant it appears. The new file is hashed against
  the published hash before the rename, and its verified marker written after it.

Module layout: :mod:`~shardstream.client.cache.layout` (folders),
:mod:`~shardstream.client.cache.keys` (file names),
:mod:`~shardstream.client.cache.space` (limit, scans, eviction),
:mod:`~shardstream.client.cache.verify` (verified markers),
:mod:`~shardstream.client.cache.lease` (leases and counters),
:mod:`~shardstream.client.cache.filelock` (the locks).
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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from shardstream.client.cache.filelock import lock_path, pin_file, unlink_and_close
from shardstream.client.cache.keys import key_to_name
from shardstream.client.cache.layout import CacheLayout
from shardstream.client.cache.lease import CacheStats, ShardLease
from shardstream.client.cache.private_paths import FILE_MODE, write_private
from shardstream.client.cache.space import CacheSpace
from shardstream.client.cache.verify import (
    Identity,
    TrustedFiles,
    file_identity,
    first_digest,
    vouched_digest,
)
from shardstream.errors import ConfigError, CorruptShardError

__all__ = ["CacheStats", "Fetch", "ShardCache", "ShardLease", "process_cache_counts"]

log = logging.getLogger(__name__)

Fetch = Callable[[Path], "bool | None"]
"""Writes the final (verified, uncompressed) bytes of a shard to the path it is given.

It returns ``True`` when it checked every byte it wrote against the shard's published
digests (the per-block digests of a ranged fill, or the file hash of a whole download):
the cache then records the verified marker without reading and hashing the file again.
Any other return value (``None``) has the cache hash the new file before publishing it."""


class _ProcessState:
    """Per-process mutable state, recreated after a fork (stats are per process)."""

    def __init__(self, marker_path: Callable[[str], Path]) -> None:
        self.lock = threading.Lock()
        self.stats = CacheStats()
        self.warned_over_limit = False
        self.trusted = TrustedFiles(marker_path)
        self.touched: dict[str, int] = {}


# Every live cache, so a forked child can give each one fresh per-process state.
_CACHES: weakref.WeakSet[ShardCache] = weakref.WeakSet()
# Hits and misses of every cache this process has had, closed ones too (zeroed in a child).
_PROCESS_LOCK = threading.Lock()
_PROCESS_COUNTS = [0, 0]
# key -> (file name, data path) of recent keys; the hot path skips escaping and Path().
_NAME_CACHE_SIZE = 65536


class ShardCache:
    """A node-wide shard cache in ``root``, optionally bounded by ``limit_bytes``.

    ``limit_bytes`` None means unbounded. A single shard larger than the limit is a
    ConfigError (the limit must hold at least every shard open at once). The limit is
    exceeded only when every cached shard is pinned by a lease; that logs one warning per
    process, and the cache returns within the limit as those pins are released (and
    whenever a cache opens on the folder). ``rescan_interval_s`` bounds how long the
    shared size hint is trusted without a directory scan; ``touch_interval_s`` how often
    a hit refreshes a shard's LRU age. Safe to share between threads and across ``fork``.
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
        self._layout = CacheLayout.at(root)
        self._layout.create()
        self._space = CacheSpace(self._layout, limit_bytes, rescan_interval_s)
        self._touch_ns = int(touch_interval_s * 1e9)
        self._state = _ProcessState(self._layout.marker_path)
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
        if limit_bytes is not None:
            _record_limit(self._layout.limit_file, limit_bytes)
            done = self._space.enforce()
            if done.evicted:
                log.info(
                    "shard cache %s: evicted %d shards (%d bytes) to return within its limit",
                    self.root,
                    done.evicted,
                    done.evicted_bytes,
                )

    @property
    def root(self) -> Path:
        """The cache directory."""
        return self._layout.root

    @property
    def layout(self) -> CacheLayout:
        """Where the cache keeps its files (what the read path asks, instead of globbing)."""
        return self._layout

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
    def lease(
        self, key: str, fetch: Fetch, *, size: int, hashes: Mapping[str, str] | None = None
    ) -> Iterator[Path]:
        """Pin ``key`` for the ``with`` block, downloading it first if needed.

        ``fetch(tmp)`` runs in at most one process per node at a time per key; it must
        write exactly ``size`` bytes (the final, uncompressed shard) to ``tmp``.
        ``hashes`` are the shard's published digests (``raw_data.hashes`` of
        ``index.json``): the file is checked against them when it enters the cache and
        whenever it may have changed since. Without them the cache records its own digest
        of what the fetch wrote, and re-fetches a file it can no longer vouch for.
        """
        held = self.acquire(key, fetch, size=size, hashes=hashes)
        try:
            yield held.path
        finally:
            held.release()

    def prefetch(
        self, key: str, fetch: Fetch, *, size: int, hashes: Mapping[str, str] | None = None
    ) -> bool:
        """Make sure ``key`` is cached without holding it; True if this call downloaded it."""
        held, downloaded = self._acquire(key, fetch, size, hashes or {})
        held.release()
        return downloaded

    def acquire(
        self, key: str, fetch: Fetch, *, size: int, hashes: Mapping[str, str] | None = None
    ) -> ShardLease:
        """Like :meth:`lease`, returning a :class:`ShardLease` to release explicitly."""
        return self._acquire(key, fetch, size, hashes or {})[0]

    def enforce_limit(self) -> int:
        """Evict unpinned shards until the cache is within its limit; returns how many
        were evicted (a shard in use is never evicted, so the cache may stay over)."""
        done = self._space.enforce()
        self._count(evictions=done.evicted, bytes_evicted=done.evicted_bytes)
        return done.evicted

    def _acquire(
        self, key: str, fetch: Fetch, size: int, hashes: Mapping[str, str]
    ) -> tuple[ShardLease, bool]:
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
        rejected = None
        if pinned is not None:
            problem = self._problem(name, pinned, size, hashes)
            if not problem:
                self._touch(name)
                with self._state.lock:
                    self._state.stats.hits += 1
                _count_process(hits=1)
                return self._lease(key, data, pinned[0], size), False
            os.close(pinned[0])
            # A downloader renames a shard in and then records its marker (the rename
            # changes the ctime the marker binds to), both under the download lock. A file
            # with no marker yet may be such a shard: decide under that lock, quietly.
            if self._layout.marker_path(name).exists():
                self._warn_refused(key, problem)
                rejected = file_identity(pinned[1])
        self._count(misses=1)
        _count_process(misses=1)
        return self._download(key, name, data, fetch, size=size, hashes=hashes, rejected=rejected)

    def _usable(
        self,
        key: str,
        name: str,
        pinned: tuple[int, os.stat_result],
        size: int,
        hashes: Mapping[str, str],
    ) -> bool:
        """Whether the pinned cached file holds the verified bytes of ``key``."""
        problem = self._problem(name, pinned, size, hashes)
        if problem:
            self._warn_refused(key, problem)
        return not problem

    def _problem(
        self, name: str, pinned: tuple[int, os.stat_result], size: int, hashes: Mapping[str, str]
    ) -> str:
        """Why the pinned cached file cannot be used ("" when it can)."""
        fd, st = pinned
        if st.st_size != size:
            return f"holds {st.st_size} bytes, not {size}"
        return self._state.trusted.check(name, fd, st, hashes) or ""

    def _warn_refused(self, key: str, problem: str) -> None:
        log.warning(
            "shard cache %s: cached shard %r failed its check (%s): it changed, was "
            "truncated or is corrupt; evicting it and fetching it again",
            self.root,
            key,
            problem,
        )

    def _discard(self, name: str, data: Path) -> None:
        """Remove a cached file that failed its check; the caller holds its download lock.
        Readers that pinned it keep their (bad) mapping; no one new can get it."""
        self._state.trusted.forget(name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(data)
        self._count(repaired=1)

    def _lease(self, key: str, data: Path, fd: int, size: int) -> ShardLease:
        return ShardLease(key, data, fd, size, self._after_release)

    def _after_release(self) -> None:
        """A pin went away: if the cache is over its limit, this may be what kept it."""
        if self._space.limit_bytes is None or not self._space.is_flagged_over():
            return
        try:
            self.enforce_limit()
        except OSError as exc:  # releasing must not fail; the next open or miss retries
            log.debug("shard cache %s: eviction after release failed: %s", self.root, exc)

    def _download(
        self,
        key: str,
        name: str,
        data: Path,
        fetch: Fetch,
        *,
        size: int,
        hashes: Mapping[str, str],
        rejected: Identity | None,
    ) -> tuple[ShardLease, bool]:
        """The miss path: one downloader per shard per node, the others wait and reuse.

        ``rejected``: the identity of the cached file the hit path just refused; if it is
        still there it is discarded without a second check."""
        lock = self._layout.download_lock(name)
        lock_fd = lock_path(lock, blocking=True)
        assert lock_fd is not None  # blocking
        try:
            pinned = pin_file(data)
            if pinned is not None:  # another process finished or repaired it meanwhile
                if file_identity(pinned[1]) != rejected and self._usable(
                    key, name, pinned, size, hashes
                ):
                    self._count(waits=1)
                    return self._lease(key, data, pinned[0], size), False
                os.close(pinned[0])
                self._discard(name, data)
            res = self._space.reserve(name, size, os.getpid())
            self._count(
                evictions=res.evicted, bytes_evicted=res.evicted_bytes, scans=int(res.scanned)
            )
            if res.over_limit:
                self._warn_over_limit(key, size)
            fd = -1
            try:
                target = CacheLayout.download_file(res.tmp_dir, key)
                vouched = fetch(target) is True
                fd, st = _pin_new(target, key, size)
                os.fchmod(fd, FILE_MODE)  # whatever the fetch (or the umask) made it
                st = os.fstat(fd)  # the chmod changed its ctime
                verdict = (vouched and vouched_digest(st, hashes)) or first_digest(fd, st, hashes)
                if not verdict.ok or verdict.marker is None:
                    raise CorruptShardError(
                        f"shard {key!r}: the bytes fetched from its source do not match its "
                        f"published hash ({verdict.reason}); the stored object is corrupt or "
                        "was replaced after its index was written: rebuild or re-upload it"
                    )
                os.rename(target, data)
                st = os.fstat(fd)  # the rename changed its ctime
                self._state.trusted.record(
                    name, dataclasses.replace(verdict.marker, identity=file_identity(st))
                )
            except BaseException:
                if fd >= 0:
                    os.close(fd)
                self._space.release(res.tmp_dir, size)
                raise
            shutil.rmtree(res.tmp_dir, ignore_errors=True)
            self._count(downloads=1, bytes_downloaded=size)
            return self._lease(key, data, fd, st.st_size), True
        finally:
            unlink_and_close(lock_fd, lock)

    def _touch(self, name: str) -> None:
        """Refresh the LRU age (the marker's ``mtime``: touching the shard itself would
        void its marker), at most once per ``touch_interval_s`` per shard and process."""
        now = time.time_ns()
        touched = self._state.touched
        if now - touched.get(name, 0) > self._touch_ns:
            if len(touched) >= _NAME_CACHE_SIZE:
                touched.clear()
            touched[name] = now
            # OSError: e.g. another user's file; the LRU age is advisory.
            with contextlib.suppress(OSError):
                os.utime(self._layout.marker_path(name))

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
        self._state = _ProcessState(self._layout.marker_path)

    def _count(self, **deltas: int) -> None:
        state = self._state
        with state.lock:
            for field, delta in deltas.items():
                setattr(state.stats, field, getattr(state.stats, field) + delta)


def process_cache_counts() -> tuple[int, int]:
    """(hits, misses) of every cache of this process since it started (or was forked),
    including caches already closed: read paths come and go with each pass."""
    with _PROCESS_LOCK:
        return _PROCESS_COUNTS[0], _PROCESS_COUNTS[1]


def _count_process(*, hits: int = 0, misses: int = 0) -> None:
    with _PROCESS_LOCK:
        _PROCESS_COUNTS[0] += hits
        _PROCESS_COUNTS[1] += misses


def _reset_after_fork() -> None:
    global _PROCESS_LOCK  # noqa: PLW0603  (a lock held at the fork stays held in the child)
    _PROCESS_LOCK = threading.Lock()
    _PROCESS_COUNTS[:] = [0, 0]
    for cache in list(_CACHES):
        cache._after_fork()


os.register_at_fork(after_in_child=_reset_after_fork)


def _record_limit(path: Path, limit: int) -> None:
    """Note the limit in the cache folder, for ``shardstream cache stats|prune``."""
    try:
        if path.read_text().strip() == str(limit):
            return
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):
        write_private(path, f"{limit}\n".encode())


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
