"""Cacheless reads on one node share what they fetched: each process's memory files,
findable by the other processes of the node.

In cacheless mode every reading process (DDP rank, DataLoader or loader worker) holds its
own memory-backed shard files (``memfd``). Without sharing, a block that several of them
need is fetched by each: ``W`` processes fetch ``W`` times the dataset per node. So each
process registers its memory file of a shard as a symlink in a node-wide folder,
``$TMPDIR/shardstream-<uid>/memory-peers/<shard name>.<pid>`` pointing at
``/proc/<pid>/fd/<fd>``. Before fetching a block range, a process reads it from the other
processes' files when they hold it and it matches its digests (the same check as for a
fetched block: a hole, a dropped block or a half-written one simply fails it).

Two processes that want the same missing block at the same moment would both fetch it.
So a fetch first takes a lock on its blocks in a per-shard claims file (:class:`BlockClaims`,
Linux open-file-description byte-range locks, one byte per block): the first process
fetches, the others wait for it and then copy the block from its file. The kernel drops
the locks of a process that dies, and a wait is bounded (:data:`CLAIM_WAIT_S`), after which
the waiter fetches the block itself: a stopped peer costs time, never a hang.

Nothing here holds data outside a process's own budget: a process never writes into
another's file, and each copies what it takes into its own memory. The links hold no
bytes, and a memory file dies with its process (also on SIGKILL), so a dead process
leaves only a dangling link, removed by the next process that lists the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from shardstream.client.cache.layout import KeyedFolder
from shardstream.client.cache.private_paths import open_private, private_folder

__all__ = ["CLAIM_WAIT_S", "BlockClaims", "MemoryPeers"]

CLAIM_WAIT_S = 10.0
"""The longest a process waits for another one's fetch of the same blocks."""

_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64 and aarch64 (l_type, l_whence, start, len, pid)


class MemoryPeers:
    """The node-wide folder of this process's and its peers' memory shard files."""

    def __init__(self, root: Path | None = None) -> None:
        base = Path(tempfile.gettempdir()) / f"shardstream-{os.getuid()}"
        self.root = root if root is not None else base / "memory-peers"
        self._pid = os.getpid()
        self._files = KeyedFolder(self.root)  # <key's name>.<pid> links, <key's name>.claims
        self.shared = _private_dirs(base, self.root) if root is None else _private_dirs(root)
        """Whether the folder is usable: this user's own, not writable by others (else a
        process reads and claims alone, as if no peer existed)."""

    def claims(self, key: str) -> BlockClaims | None:
        """The claims file of shard ``key``, shared by the node's processes."""
        return BlockClaims(self._files.file(key, "claims")) if self.shared else None

    def register(self, key: str, fd: int) -> Path | None:
        """Announce this process's memory file ``fd`` of shard ``key``; returns the link
        (``None`` where the folder is not usable)."""
        if not self.shared:
            return None
        link = self._files.file(key, str(self._pid))
        try:
            with contextlib.suppress(FileNotFoundError):
                link.unlink()  # a link left by a dead process that had this pid
            os.symlink(f"/proc/{self._pid}/fd/{fd}", link)
        except OSError:
            return None
        return link

    def others(self, key: str) -> list[Path]:
        """The memory files of shard ``key`` that other live processes announced."""
        if not self.shared:
            return []
        found = []
        for path, pid_text in self._files.files(key):
            if not pid_text.isdigit() or int(pid_text) == self._pid:
                continue
            if not os.path.exists(f"/proc/{pid_text}"):
                with contextlib.suppress(OSError):
                    os.unlink(path)  # its process is gone
                continue
            found.append(path)
        return found

    def withdraw(self, key: str, link: Path | None) -> None:
        """Remove this process's link (its file is being freed), and the shard's claims
        file once no process holds the shard."""
        if link is not None:
            with contextlib.suppress(OSError):
                link.unlink()
        self.release(key)

    def release(self, key: str) -> None:
        """Remove the shard's claims file if no other process holds the shard in memory (a
        racing reader recreates it: claims only save fetches, never decide correctness)."""
        claims = self.claims(key)
        if claims is not None and not self.others(key):
            with contextlib.suppress(OSError):
                claims.path.unlink()


class BlockClaims:
    """Byte-range locks over a shard's blocks, shared by the processes of a node."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self, first: int, last: int, wait_s: float = CLAIM_WAIT_S) -> Iterator[None]:
        """Hold blocks ``first..last`` (inclusive) while the body fetches them; waits while
        another process holds any of them (at most ``wait_s``, then goes on regardless)."""
        try:
            fd = open_private(self.path, os.O_RDWR)
        except OSError:
            yield  # no claims (e.g. a read-only temp dir): fetch without them
            return
        try:
            lock = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, first, last - first + 1, 0)
            deadline, pause = time.monotonic() + wait_s, 0.001
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, lock)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        break  # locks unsupported here: go on without
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
            yield
        finally:
            os.close(fd)  # releases the lock (it belongs to this open file description)


def _private_dirs(*dirs: Path) -> bool:
    """Create ``dirs`` and check each by the node's one rule for private folders
    (:mod:`~shardstream.client.cache.private_paths`): another user's folder could hand this
    process planted links (harmless, every block is verified, but wasted reads) or stall
    its claims."""
    try:
        return not any(private_folder(folder) for folder in dirs)
    except OSError:
        return False
