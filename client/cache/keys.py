"""The node cache's directory layout and file names.

::

    <root>/data/<name>                  cached shards, complete and verified
    <root>/verified/<name>.ok           each shard's verified marker; its mtime is the LRU age
    <root>/tmp/<name>.<size>.<pid>/     one in-flight download each (the fetch writes here)
    <root>/locks/<name>.dl              download locks; exist only while a download runs
    <root>/usage                        the space lock, holding a size *hint* (see cache_space)
    <root>/index/<digest>.json          server versions' shard indexes (see index_cache)
    <root>/over-limit                   present while the cache may be over its limit
    <root>/limit                        the limit last configured (``shardstream cache``)

A key such as ``"<version-id>/shard.00001.mds"`` becomes one flat, reversible file name
(``/`` and every other unsafe byte percent-escaped), so a key can never name anything
outside ``data/``, and ``ls data/`` still reads like the keys. Very long keys keep a
readable prefix plus a hash, since file names are limited to 255 bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from shardstream.client.cache.private_paths import private_folder
from shardstream.errors import ConfigError

__all__ = ["MARKER_SUFFIX", "CacheLayout", "TmpEntry", "key_to_name", "parse_tmp_name"]

MARKER_SUFFIX = ".ok"

# Escaped names stay well under NAME_MAX (255) even with the tmp suffix ".<size>.<pid>".
_MAX_NAME = 180
_MAX_KEY = 4096


def key_to_name(key: str) -> str:
    """The file name of ``key`` inside ``data/``: flat, safe and injective.

    Raises ConfigError for keys that are empty, absolute, contain NUL, or have empty,
    ``.`` or ``..`` path components (nothing may resolve outside the cache).

    >>> key_to_name("v1/shard.00001.mds")
    'v1%2Fshard.00001.mds'
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"cache key {key!r} is empty; give '<version>/<shard basename>'")
    if len(key) > _MAX_KEY or "\x00" in key:
        raise ConfigError(f"cache key {key[:80]!r}... is longer than {_MAX_KEY} or contains NUL")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"cache key {key!r} is absolute or has an empty, '.' or '..' component; "
            "keys are relative paths like '<version>/shard.00000.mds'"
        )
    # quote() leaves '~' alone; escape it too so '~' only ever marks a hashed name.
    name = quote(key, safe="").replace("~", "%7E")
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        name = f"{name[: _MAX_NAME - 34]}~h{digest}"
    return name


def leaf_name(key: str) -> str:
    """A readable file name for the fetch's target: the key's last component, escaped."""
    leaf = quote(key.rsplit("/", 1)[-1], safe="")
    return leaf[-100:] if len(leaf) > 100 else leaf


@dataclass(frozen=True)
class TmpEntry:
    """One in-flight download folder under ``tmp/``: whose shard, how big, which pid."""

    name: str
    size: int
    pid: int


def parse_tmp_name(entry: str) -> TmpEntry | None:
    """Parse ``<name>.<size>.<pid>``; None for anything we did not create."""
    parts = entry.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return TmpEntry(parts[0], int(parts[1]), int(parts[2]))


@dataclass(frozen=True)
class CacheLayout:
    """The paths of one cache root; :meth:`create` makes the folders."""

    root: Path

    @property
    def data(self) -> Path:
        """Folder of complete shards."""
        return self.root / "data"

    @property
    def tmp(self) -> Path:
        """Folder of in-flight downloads."""
        return self.root / "tmp"

    @property
    def locks(self) -> Path:
        """Folder of per-shard download locks."""
        return self.root / "locks"

    @property
    def verified(self) -> Path:
        """Folder of verified markers, one per cached shard (:mod:`..verify`); a marker's
        ``mtime`` is its shard's LRU age."""
        return self.root / "verified"

    @property
    def over_flag(self) -> Path:
        """Exists while some process found the cache over its limit; whoever releases a
        pin then evicts (see :meth:`..cache_space.CacheSpace.enforce`)."""
        return self.root / "over-limit"

    @property
    def limit_file(self) -> Path:
        """The limit last configured by a process (for ``shardstream cache``)."""
        return self.root / "limit"

    def marker_path(self, name: str) -> Path:
        """The verified marker of shard ``name`` (a suffix, so that nothing outside
        ``data/`` looks like a shard to ``ls`` or a glob)."""
        return self.root / "verified" / f"{name}{MARKER_SUFFIX}"

    @property
    def index(self) -> Path:
        """Folder of server versions' shard indexes (:mod:`..index_cache`)."""
        return self.root / "index"

    @property
    def usage(self) -> Path:
        """The space lock file (and size hint)."""
        return self.root / "usage"

    def data_path(self, name: str) -> Path:
        """Where shard ``name`` lives when cached."""
        return self.root / "data" / name

    def download_lock(self, name: str) -> Path:
        """The lock a downloader of shard ``name`` holds."""
        return self.root / "locks" / f"{name}.dl"

    def tmp_dir(self, name: str, size: int, pid: int) -> Path:
        """The private folder of one download (its size reserved by the name)."""
        return self.root / "tmp" / f"{name}.{size}.{pid}"

    @classmethod
    def at(cls, root: Path | str) -> CacheLayout:
        """The layout of the cache folder ``root``, its links resolved once: the folder
        checked by :meth:`create` is the one used, even if a link to it is swapped later."""
        return cls(Path(root).expanduser().resolve())

    def create(self, *folders: Path) -> None:
        """Create ``folders`` (default: those of the shard cache), private to this user.

        Raises one ConfigError naming the folder and the fix when the root is not usable:
        not creatable, or not this user's own (:mod:`..private_paths`: another local user
        who owns or can write it could swap cached shards and forge their markers)."""
        try:
            problem = private_folder(self.root, tighten=False)
            for folder in folders or (self.data, self.tmp, self.locks, self.verified):
                problem = problem or private_folder(folder)
        except OSError as exc:
            raise ConfigError(
                f"cannot use cache directory {self.root} ({exc.strerror}); set "
                "SHARDSTREAM_CACHE_DIR (or CacheOptions.dir) to a writable local folder"
            ) from exc
        if problem:
            raise ConfigError(
                f"refusing cache directory {self.root}: {problem} (set SHARDSTREAM_CACHE_DIR "
                "or CacheOptions.dir to another folder)"
            )
