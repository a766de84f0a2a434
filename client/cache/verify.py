"""The node cache's proof that a cached shard holds its bytes.

A shard's bytes are hashed once when they enter the cache (after the fetch, before the
rename that makes them visible). The result is a *verified marker*, ``verified/<name>``:
the algorithm, the digest, and the identity of the file it was computed on (the file
is ``verified/<name>.ok``)::

    shardstream-verified-v1 <boot id> <algo> <digest> <dev> <ino> <size> <mtime_ns> <ctime_ns>

A reader trusts a cached file only while its ``fstat`` still shows that identity, and
only in the boot the marker was written in (after a crash, a file's bytes may not be the
ones that were hashed: they are hashed again, once per node per boot). Any
write, truncation or ``touch`` of the file changes ``mtime``/``ctime``, and ``ctime``
cannot be set back by anyone but the kernel, so an edited file (a flipped byte of the
same size included) no longer matches its marker and is hashed again before use. That is
why the cache never touches a shard file itself: its LRU age is the marker's ``mtime``.

What a file is checked against: the shard's published hash (the fastest algorithm of
``index.json`` we can compute), or, for a shard published without one, the digest taken
when its download (verified by the fetch) entered the cache. A file that has neither is
not trusted: it is fetched again.

Cost on the warm path: the first use of a shard in a process reads its marker (one small
file); later uses compare the ``fstat`` the pin already made with the one remembered.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from shardstream.client.cache.private_paths import write_private
from shardstream.hashing import choose_verify_algo, new_hasher

__all__ = [
    "BOOT_ID",
    "Identity",
    "Marker",
    "TrustedFiles",
    "Verdict",
    "digest_fd",
    "file_identity",
    "first_digest",
    "judge",
    "read_marker",
    "vouched_digest",
    "write_marker",
]

_MAGIC = "shardstream-verified-v1"
_CHUNK = 8 << 20
_LOCAL_ALGO = "xxh3_64"  # for shards published without a hash we can compute

Identity = tuple[int, int, int, int, int]
"""(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of a cached file."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or "-"
    except OSError:
        return "-"


BOOT_ID = _boot_id()


def file_identity(st: os.stat_result) -> Identity:
    """What must stay equal for a verified file to still hold the verified bytes."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Marker:
    """A verified marker: ``digest`` under ``algo`` of the file with ``identity``."""

    algo: str
    digest: str
    identity: Identity
    boot: str = BOOT_ID

    def vouches_for(self, st: os.stat_result, hashes: Mapping[str, str]) -> bool:
        """True when the file with ``fstat`` ``st`` is the one verified, in this boot,
        against a digest the published ``hashes`` do not contradict."""
        return (
            self.boot == BOOT_ID and self.identity == file_identity(st) and self.agrees_with(hashes)
        )

    def agrees_with(self, hashes: Mapping[str, str]) -> bool:
        """False when the published hashes name this algorithm with another digest."""
        published = hashes.get(self.algo)
        return published is None or published == self.digest


def read_marker(path: Path) -> Marker | None:
    """The marker at ``path``; None when missing or unreadable (then re-verify)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(512)
    except OSError:
        return None
    parts = raw.decode("ascii", "replace").split()
    if len(parts) != 9 or parts[0] != _MAGIC:
        return None
    try:
        numbers = tuple(int(p) for p in parts[4:])
    except ValueError:
        return None
    dev, ino, size, mtime, ctime = numbers
    return Marker(parts[2], parts[3], (dev, ino, size, mtime, ctime), parts[1])


def write_marker(path: Path, marker: Marker) -> None:
    """Write ``marker`` atomically (temporary file, rename): readers see all or nothing."""
    fields = [_MAGIC, marker.boot, marker.algo, marker.digest, *map(str, marker.identity)]
    line = " ".join(fields) + "\n"
    with contextlib.suppress(FileNotFoundError):
        # FileNotFoundError: the folder was swept meanwhile; no marker only costs a
        # re-verification.
        write_private(path, line.encode("ascii"))


def digest_fd(fd: int, algo: str) -> str:
    """``algo`` digest of the open file ``fd`` (read with ``pread``: the pinned inode,
    whatever its path names now)."""
    hasher = new_hasher(algo)
    offset = 0
    while chunk := os.pread(fd, _CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.hexdigest()


@dataclass(frozen=True)
class Verdict:
    """The outcome of hashing a cached file: ``marker`` to record when ``ok``."""

    ok: bool
    marker: Marker | None
    reason: str


def judge(
    fd: int, st: os.stat_result, hashes: Mapping[str, str], previous: Marker | None
) -> Verdict:
    """Hash the file ``fd`` against the published ``hashes`` (or, if none is usable, the
    digest ``previous`` recorded at download)."""
    identity = file_identity(st)
    algo = choose_verify_algo(hashes)
    if algo is not None:
        expected = hashes[algo]
    elif previous is not None:
        algo, expected = previous.algo, previous.digest
    else:
        return Verdict(False, None, "no published hash and no digest recorded at download")
    actual = digest_fd(fd, algo)
    if actual != expected:
        return Verdict(False, None, f"{algo} is {actual}, expected {expected}")
    return Verdict(True, Marker(algo, actual, identity), "")


def first_digest(fd: int, st: os.stat_result, hashes: Mapping[str, str]) -> Verdict:
    """Hash a freshly fetched file: against the published hash when there is one we can
    compute, else record its own digest (the fetch verified what it could)."""
    if choose_verify_algo(hashes) is not None:
        return judge(fd, st, hashes, None)
    return Verdict(True, Marker(_LOCAL_ALGO, digest_fd(fd, _LOCAL_ALGO), file_identity(st)), "")


def vouched_digest(st: os.stat_result, hashes: Mapping[str, str]) -> Verdict | None:
    """The verdict on a freshly fetched file whose fetch checked every byte against the
    published digests: the published hash the cache would check (as :func:`first_digest`
    chooses it), recorded without reading the file; ``None`` when there is no such hash."""
    algo = choose_verify_algo(hashes)
    if algo is None:
        return None
    return Verdict(True, Marker(algo, hashes[algo], file_identity(st)), "")


_MEMO_SIZE = 65536


class TrustedFiles:
    """One process's view of which cached files it may read (see the module docstring).

    ``check`` is the whole decision: the remembered identity, else the marker, else a
    full hash (then a new marker). Safe to call from several threads: the worst race
    hashes a file twice.
    """

    def __init__(self, marker_path: Callable[[str], Path]) -> None:
        self.marker_path = marker_path
        self._memo: dict[str, Identity] = {}
        self.hashed = 0
        """Full hashes of cached files this process made (first opens without a marker)."""

    def check(self, name: str, fd: int, st: os.stat_result, hashes: Mapping[str, str]) -> str:
        """ "" when the pinned file ``fd`` may be read; otherwise why not."""
        identity = file_identity(st)
        if self._memo.get(name) == identity:
            return ""
        path = self.marker_path(name)
        marker = read_marker(path)
        if marker is not None and marker.vouches_for(st, hashes):
            self._remember(name, identity)
            return ""
        self.hashed += 1
        verdict = judge(fd, st, hashes, marker)
        if not verdict.ok or verdict.marker is None:
            return verdict.reason
        write_marker(path, verdict.marker)
        self._remember(name, identity)
        return ""

    def record(self, name: str, marker: Marker) -> None:
        """Store the marker of a file that just entered the cache."""
        write_marker(self.marker_path(name), marker)
        self._remember(name, marker.identity)

    def forget(self, name: str) -> None:
        """Drop the marker of a file about to be removed (before the file goes: a marker
        never outlives its file's removal, so it cannot vouch for a new download)."""
        self._memo.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.marker_path(name))

    def _remember(self, name: str, identity: Identity) -> None:
        if len(self._memo) >= _MEMO_SIZE:
            self._memo.clear()
        self._memo[name] = identity
