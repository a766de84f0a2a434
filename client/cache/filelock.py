"""``flock`` helpers for the node cache: lock files that may be deleted, and pinned files.

Every lock here is a BSD ``flock`` on an open file description, so the kernel drops it
when the process dies, however it dies (SIGKILL included): a crashed process can never
leave a lock behind. Two rules make that safe in the presence of ``fork`` and deletion:

* locks are released by *closing* the descriptor, never by ``LOCK_UN``: after a fork
  parent and child share the open file description, and ``LOCK_UN`` from either would
  drop the other's lock too;
* a lock file may be unlinked by its holder, so whoever acquires one re-checks that the
  path still names the inode it locked (:func:`lock_path`); otherwise two processes could
  each "hold" the lock on two different inodes.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from shardstream.client.cache.private_paths import open_private

__all__ = ["lock_path", "pin_file", "try_evict_lock", "unlink_and_close"]

_OPEN_DATA = os.O_RDONLY | os.O_CLOEXEC


def lock_path(path: Path, *, blocking: bool) -> int | None:
    """Exclusively lock the file ``path`` (created if missing) and return its descriptor.

    Returns None only when ``blocking`` is false and another process holds the lock.
    The descriptor is guaranteed to lock the inode that ``path`` names right now: if the
    previous holder unlinked the file while we waited, we start over on the new one.
    """
    op = fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB
    while True:
        fd = open_private(path, os.O_RDWR)
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            current = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        held = os.fstat(fd)
        if (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
            return fd
        os.close(fd)


def unlink_and_close(fd: int, path: Path) -> None:
    """Delete a lock file acquired with :func:`lock_path`, then release it.

    Unlinking *before* closing is what lets waiters notice (their inode check fails) and
    keeps lock files from piling up: one exists only while someone holds it.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def pin_file(path: Path) -> tuple[int, os.stat_result] | None:
    """Open ``path`` and take a shared lock on it: the pin that keeps it from eviction.

    Returns (descriptor, its ``fstat``) or None when the file does not exist or was
    evicted while we waited for the lock (an evictor unlinks it under an exclusive lock,
    so a pin that lands on an unlinked inode is worthless). Three syscalls on a hit:
    open, flock, fstat.
    """
    try:
        fd = os.open(path, _OPEN_DATA)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if st.st_nlink == 0:
        os.close(fd)
        return None
    return fd, st


def try_evict_lock(path: Path) -> tuple[int, os.stat_result] | None:
    """Try, without waiting, to lock ``path`` exclusively for deletion.

    Returns (descriptor, fstat) when nobody pins the file; None when it is pinned (a
    reader holds a shared lock), already gone, or already unlinked. The caller unlinks
    the path and then closes the descriptor.
    """
    try:
        fd = os.open(path, _OPEN_DATA)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    st = os.fstat(fd)
    if st.st_nlink == 0:
        os.close(fd)
        return None
    return fd, st
