"""The node cache's size limit and least-recently-used eviction.

Bytes enter the cache only through a *reservation*: before a download starts, its
declared size is added under the node-wide space lock (``<root>/usage``, an ``flock``),
evicting least recently used shards first if the limit would be crossed, and the
download's private ``tmp/<name>.<size>.<pid>/`` folder is created under the same lock.
So concurrent downloads on a node cannot overshoot the limit together.

The running total lives in the lock file as a *hint* (``<bytes> <time of last scan>``).
It is a cache of a directory scan, never the truth: when it is missing, unparsable,
older than ``rescan_interval_s``, or says the limit would be crossed, the scan recomputes
it (``data/`` sizes plus the declared sizes of live downloads). The hint only ever errs
high (a crashed download's reservation), which costs an early scan, never an overshoot.
Hits never touch it: the lock is taken on misses only.

Eviction frees a little more than needed (up to 1/16 of the limit, at most 15 shards of
the size being added; nothing when the limit holds under 16 shards), so a full cache
scans about once per 15 misses rather than on every one. It walks ``data/`` least
recently used first (a shard's age is its verified marker's ``mtime``, which hits
refresh) and deletes a file only under an exclusive, non-blocking ``flock``: a shard that
any process has pinned (shared lock) is skipped, never waited for. If everything left is
pinned the reservation goes over the limit, the caller warns, and the ``over-limit``
flag goes up: every process that releases a pin while it is up runs :meth:`enforce`,
which evicts back to the limit, and so does every cache that opens. So the limit comes
back as soon as the shards holding it over are released, not on the next miss.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shardstream.client.cache.filelock import lock_path, try_evict_lock, unlink_and_close
from shardstream.client.cache.keys import MARKER_SUFFIX, TmpEntry, parse_tmp_name
from shardstream.client.cache.layout import CacheLayout
from shardstream.client.cache.private_paths import DIR_MODE, open_private

__all__ = ["CacheSpace", "Enforced", "Reservation", "Survey"]

_MAGIC = b"shardstream-cache-usage-v1"


@dataclass(frozen=True)
class Reservation:
    """What one :meth:`CacheSpace.reserve` did."""

    tmp_dir: Path
    evicted: int
    evicted_bytes: int
    scanned: bool
    over_limit: bool


@dataclass(frozen=True)
class Enforced:
    """What one :meth:`CacheSpace.enforce` did; ``over`` when pinned shards alone still
    exceed the limit."""

    evicted: int
    evicted_bytes: int
    total: int
    over: bool


@dataclass(frozen=True)
class Survey:
    """The cache as :meth:`CacheSpace.survey` found it."""

    entries: int
    bytes: int
    pinned: int
    pinned_bytes: int
    download_bytes: int


@dataclass
class _Usage:
    """The hint read from the space lock file; ``total`` None when it must be rescanned."""

    total: int | None
    scanned_at: float


class CacheSpace:
    """Reservations, scans and eviction for one cache root (see the module docstring)."""

    def __init__(self, layout: CacheLayout, limit_bytes: int | None, rescan_interval_s: float):
        self.layout = layout
        self.limit_bytes = limit_bytes
        self.rescan_interval_s = rescan_interval_s
        self._over_flag = str(layout.over_flag)  # checked on every release: no Path()

    @contextmanager
    def _locked(self) -> Iterator[_Usage]:
        """Hold the node-wide space lock; read the hint, write it back on exit."""
        fd = open_private(self.layout.usage, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            usage = _parse(os.pread(fd, 128, 0))
            before = (usage.total, usage.scanned_at)
            yield usage
            if (usage.total, usage.scanned_at) != before and usage.total is not None:
                record = b"%s %d %.3f\n" % (_MAGIC, max(usage.total, 0), usage.scanned_at)
                os.pwrite(fd, record, 0)
                os.ftruncate(fd, len(record))
        finally:
            os.close(fd)  # releases the flock

    def reserve(self, name: str, size: int, pid: int) -> Reservation:
        """Make room for ``size`` bytes of shard ``name`` and create its download folder.

        The caller holds the download lock of ``name``, so any leftover folder of
        ``name`` belongs to a dead process and is removed here.
        """
        evicted = evicted_bytes = 0
        scanned = over = False
        with self._locked() as usage:
            freed = self._remove_tmp(lambda entry: entry.name == name)
            if usage.total is not None:
                usage.total -= freed
            limit = self.limit_bytes
            stale = time.time() - usage.scanned_at > self.rescan_interval_s
            if usage.total is None or stale or (limit is not None and usage.total + size > limit):
                files = self._scan(usage)
                scanned = True
                if limit is not None and usage.total is not None:
                    need = usage.total + size - limit
                    if need > 0:
                        need += _headroom(limit, size)
                        evicted, evicted_bytes = self._evict(files, need)
                        usage.total -= evicted_bytes
                    over = usage.total + size > limit
            if over:
                self._flag_over(True)
            assert usage.total is not None  # set by the scan when it was missing
            usage.total += size
            tmp_dir = self.layout.tmp_dir(name, size, pid)
            tmp_dir.mkdir(mode=DIR_MODE)
            os.chmod(tmp_dir, DIR_MODE)  # the umask may have taken bits away
        return Reservation(tmp_dir, evicted, evicted_bytes, scanned, over)

    def release(self, tmp_dir: Path, size: int) -> None:
        """Give back a reservation whose download failed, removing its folder.

        Both under the lock: a scan between the two would not see the folder, and the
        subtraction would then count it out twice.
        """
        with self._locked() as usage:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            if usage.total is not None:
                usage.total -= size

    def sweep(self) -> int:
        """Remove what dead processes left: download folders and download lock files.

        A folder is dead when nobody holds its shard's download lock: the kernel dropped
        that lock when its owner died. Returns the number of folders removed.
        """
        removed = 0
        with self._locked() as usage:
            dead: list[TmpEntry] = []
            freed = self._remove_tmp(lambda entry: self._probe_dead(entry.name), dead)
            removed = len(dead)
            if usage.total is not None:
                usage.total -= freed
        for lock in _listdir(self.layout.locks):
            if lock.endswith(".dl"):
                path = self.layout.locks / lock
                fd = lock_path(path, blocking=False)
                if fd is not None:
                    unlink_and_close(fd, path)
        return removed

    def enforce(self, *, limit: int | None = None, force_scan: bool = False) -> Enforced:
        """Bring the cache back within ``limit`` (default: this space's limit), evicting
        least recently used unpinned shards; a shard in use is never touched.

        Runs when a cache opens and when a pin is released while the over-limit flag is
        up, so the limit comes back as soon as shards stop being used, not on the next
        miss. Cheap when the hint says the cache is within the limit: no scan.
        """
        limit = self.limit_bytes if limit is None else limit
        with self._locked() as usage:
            stale = time.time() - usage.scanned_at > self.rescan_interval_s
            if limit is None:
                return Enforced(0, 0, usage.total or 0, False)
            if not (force_scan or stale or usage.total is None or usage.total > limit):
                self._flag_over(False)
                return Enforced(0, 0, usage.total, False)
            files = self._scan(usage)
            assert usage.total is not None
            evicted = freed = 0
            if usage.total > limit:
                evicted, freed = self._evict(files, usage.total - limit)
                usage.total -= freed
            over = usage.total > limit
            self._flag_over(over)
            return Enforced(evicted, freed, usage.total, over)

    def is_flagged_over(self) -> bool:
        """Whether some process saw the cache over its limit (one ``stat``)."""
        return os.path.exists(self._over_flag)

    def _flag_over(self, over: bool) -> None:
        flag = self.layout.over_flag
        if over:
            os.close(open_private(flag, os.O_RDONLY))
        else:
            flag.unlink(missing_ok=True)

    def survey(self) -> Survey:
        """Entries, bytes, and which are pinned now (probed with a non-blocking exclusive
        lock, released at once); for ``shardstream cache stats``."""
        entries = total = pinned = pinned_bytes = 0
        with self._locked() as usage:
            files = self._scan(usage)
            downloads = usage.total - sum(f[1] for f in files) if usage.total else 0
        for _, size, name in files:
            entries, total = entries + 1, total + size
            if _is_pinned(self.layout.data_path(name)):
                pinned, pinned_bytes = pinned + 1, pinned_bytes + size
        return Survey(entries, total, pinned, pinned_bytes, downloads)

    def total(self) -> int:
        """Bytes in the cache now (shards plus reserved downloads), by a fresh scan."""
        with self._locked() as usage:
            self._scan(usage)
            assert usage.total is not None
            return usage.total

    def _probe_dead(self, name: str) -> bool:
        """True when no live process is downloading ``name`` (we then hold nothing)."""
        path = self.layout.download_lock(name)
        fd = lock_path(path, blocking=False)
        if fd is None:
            return False
        unlink_and_close(fd, path)
        return True

    def _remove_tmp(
        self, is_dead: Callable[[TmpEntry], bool], dead: list[TmpEntry] | None = None
    ) -> int:
        """Remove dead download folders; returns their reserved bytes still in the hint."""
        freed = 0
        for entry_name in _listdir(self.layout.tmp):
            entry = parse_tmp_name(entry_name)
            if entry is None or not is_dead(entry):
                continue
            shutil.rmtree(self.layout.tmp / entry_name, ignore_errors=True)
            if dead is not None:
                dead.append(entry)
            # A reservation whose shard reached data/ is counted there, not twice.
            if not self.layout.data_path(entry.name).exists():
                freed += entry.size
        return freed

    def _scan(self, usage: _Usage) -> list[tuple[int, int, str]]:
        """Recompute the hint; returns data files as (LRU age in ns, size, name).

        The age is the marker's ``mtime`` (hits refresh it), or the file's own when it
        has no marker yet."""
        live: list[TmpEntry] = []
        for entry_name in _listdir(self.layout.tmp):
            entry = parse_tmp_name(entry_name)
            if entry is None:
                continue
            if self._probe_dead(entry.name):
                shutil.rmtree(self.layout.tmp / entry_name, ignore_errors=True)
            else:
                live.append(entry)
        # Markers are listed before data/: a marker is written after its shard's rename
        # and removed before its shard, so one whose shard is missing now is an orphan
        # (left by a killed evictor) and goes.
        ages = {
            marker.removesuffix(MARKER_SUFFIX): age
            for marker, age in _mtimes(self.layout.verified).items()
            if marker.endswith(MARKER_SUFFIX)
        }
        files: list[tuple[int, int, str]] = []
        with os.scandir(self.layout.data) as it:
            for dirent in it:
                try:
                    st = dirent.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                age = max(st.st_mtime_ns, ages.get(dirent.name, 0))
                files.append((age, st.st_size, dirent.name))
        present = {f[2] for f in files}
        for orphan in ages.keys() - present:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.layout.marker_path(orphan))
        # tmp/ was listed first: a download renamed in between is counted once, in data/.
        reserved = sum(e.size for e in live if e.name not in present)
        usage.total = sum(f[1] for f in files) + reserved
        usage.scanned_at = time.time()
        return files

    def _evict(self, files: list[tuple[int, int, str]], need: int) -> tuple[int, int]:
        """Delete least recently used, unpinned shards until ``need`` bytes are freed."""
        count = freed = 0
        recent: list[str] = []
        for mtime_ns, _, name in sorted(files):
            if freed >= need:
                break
            outcome = self._evict_one(name, mtime_ns)
            if outcome == "recent":
                recent.append(name)
            elif isinstance(outcome, int):
                count, freed = count + 1, freed + outcome
        # Shards used since the scan go last, but they do go rather than overshooting.
        for name in recent:
            if freed >= need:
                break
            outcome = self._evict_one(name, None)
            if isinstance(outcome, int):
                count, freed = count + 1, freed + outcome
        return count, freed

    def _evict_one(self, name: str, mtime_ns: int | None) -> int | str | None:
        """Delete shard ``name``: its size; None if pinned or gone; ``"recent"`` if it was
        used since the scan (its age is no longer ``mtime_ns``) and was kept."""
        path = self.layout.data_path(name)
        got = try_evict_lock(path)
        if got is None:
            return None  # pinned by a reader, or already gone
        fd, st = got
        marker = self.layout.marker_path(name)
        try:
            if mtime_ns is not None and max(st.st_mtime_ns, _mtime(marker)) != mtime_ns:
                return "recent"
            # The marker goes first: it must never vouch for a later download of ``name``.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
            os.unlink(path)
        finally:
            os.close(fd)
        return st.st_size


def _headroom(limit: int, size: int) -> int:
    """Bytes to free beyond the need, so the next misses on the node fit without a scan.

    At most 1/16 of the limit (or 15 shards); nothing when the limit holds only a few
    shards, where every shard of capacity counts more than a saved scan.
    """
    extra = limit // 16
    return min(extra, 15 * size) if extra >= size else 0


def _mtime(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


def _mtimes(folder: Path) -> dict[str, int]:
    """``mtime`` of every file in ``folder`` by name (one ``scandir``)."""
    out: dict[str, int] = {}
    try:
        with os.scandir(folder) as it:
            for dirent in it:
                with contextlib.suppress(FileNotFoundError):
                    out[dirent.name] = dirent.stat(follow_symlinks=False).st_mtime_ns
    except FileNotFoundError:
        pass
    return out


def _is_pinned(path: Path) -> bool:
    got = try_evict_lock(path)
    if got is None:
        return path.exists()
    os.close(got[0])
    return False


def _listdir(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _parse(raw: bytes) -> _Usage:
    """The hint, or a 'rescan' marker for anything unexpected (it is only a hint)."""
    line = raw.split(b"\n", 1)[0].split()
    if len(line) == 3 and line[0] == _MAGIC:
        try:
            total, at = int(line[1]), float(line[2])
        except ValueError:
            return _Usage(None, 0.0)
        if total >= 0 and at <= time.time() + 60:
            return _Usage(total, at)
    return _Usage(None, 0.0)
