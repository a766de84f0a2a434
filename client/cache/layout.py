"""The node cache's folder layout: the one place that knows where its files are.

::

    <root>/data/<name>                  cached shards, complete and verified
    <root>/verified/<name>.ok           each shard's verified marker; its mtime is the LRU age
    <root>/tmp/<name>.<size>.<pid>/     one in-flight download each (the fetch writes here)
    <root>/locks/<name>.dl              download locks; exist only while a download runs
    <root>/usage                        the space lock, holding a size *hint* (see cache.space)
    <root>/index/<digest>.json          server versions' shard indexes (see sources.index_cache)
    <root>/over-limit                   present while the cache may be over its limit
    <root>/limit                        the limit last configured (``shardstream cache``)

``<name>`` is the key's flat file name (:func:`~shardstream.client.cache.keys.key_to_name`).
The read path asks a :class:`CacheLayout` which files hold a shard's bytes
(:meth:`CacheLayout.shard_files`) and whether a file is a published one
(:meth:`CacheLayout.is_published`); nothing outside this package spells a folder name.

>>> layout = CacheLayout(Path("/cache"))
>>> layout.published("v1/shard.00001.mds")
PosixPath('/cache/data/v1%2Fshard.00001.mds')
>>> CacheLayout.is_published(layout.published("v1/shard.00001.mds"))
True
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from shardstream.client.cache.keys import MARKER_SUFFIX, key_to_name, leaf_name, parse_tmp_name
from shardstream.client.cache.private_paths import private_folder
from shardstream.errors import ConfigError

__all__ = ["CacheLayout", "KeyedFolder"]

_DATA, _TMP, _LOCKS, _VERIFIED, _INDEX = "data", "tmp", "locks", "verified", "index"


@dataclass(frozen=True)
class CacheLayout:
    """The paths of one cache root; :meth:`create` makes the folders."""

    root: Path

    @property
    def data(self) -> Path:
        """Folder of complete shards."""
        return self.root / _DATA

    @property
    def tmp(self) -> Path:
        """Folder of in-flight downloads."""
        return self.root / _TMP

    @property
    def locks(self) -> Path:
        """Folder of per-shard download locks."""
        return self.root / _LOCKS

    @property
    def verified(self) -> Path:
        """Folder of verified markers, one per cached shard (:mod:`..verify`); a marker's
        ``mtime`` is its shard's LRU age."""
        return self.root / _VERIFIED

    @property
    def over_flag(self) -> Path:
        """Exists while some process found the cache over its limit; whoever releases a
        pin then evicts (see :meth:`..space.CacheSpace.enforce`)."""
        return self.root / "over-limit"

    @property
    def limit_file(self) -> Path:
        """The limit last configured by a process (for ``shardstream cache``)."""
        return self.root / "limit"

    def marker_path(self, name: str) -> Path:
        """The verified marker of shard ``name`` (a suffix, so that nothing outside
        ``data/`` looks like a shard to ``ls`` or a glob)."""
        return self.root / _VERIFIED / f"{name}{MARKER_SUFFIX}"

    @property
    def index(self) -> Path:
        """Folder of server versions' shard indexes (:mod:`...sources.index_cache`)."""
        return self.root / _INDEX

    @property
    def usage(self) -> Path:
        """The space lock file (and size hint)."""
        return self.root / "usage"

    def data_path(self, name: str) -> Path:
        """Where shard ``name`` lives when cached."""
        return self.root / _DATA / name

    def download_lock(self, name: str) -> Path:
        """The lock a downloader of shard ``name`` holds."""
        return self.root / _LOCKS / f"{name}.dl"

    def tmp_dir(self, name: str, size: int, pid: int) -> Path:
        """The private folder of one download (its size reserved by the name)."""
        return self.root / _TMP / f"{name}.{size}.{pid}"

    # -- what the read path asks ----------------------------------------------------------

    def published(self, key: str) -> Path:
        """Where shard ``key`` lives once cached (whether or not it is there now)."""
        return self.data_path(key_to_name(key))

    @staticmethod
    def download_file(tmp_dir: Path, key: str) -> Path:
        """The file a download of ``key`` writes inside its folder :meth:`tmp_dir`."""
        return tmp_dir / leaf_name(key)

    def downloads(self, key: str, *, not_of: int | None = None) -> list[Path]:
        """The in-flight download files of shard ``key``, one per downloading process
        (sorted; each may vanish at any moment, renamed into place or abandoned); ``not_of``:
        leave out the one of that process id."""
        name, leaf = key_to_name(key), leaf_name(key)
        found = []
        for path in self.tmp.glob(f"{glob.escape(name)}.*/{glob.escape(leaf)}"):
            entry = parse_tmp_name(path.parent.name)
            if entry is not None and entry.name == name and entry.pid != not_of:
                found.append(path)
        return sorted(found)

    def shard_files(self, key: str) -> list[Path]:
        """Every file of the node cache that may hold blocks of shard ``key``: its
        in-flight downloads, then its published file (present once a fill completed; a
        reader's digest check decides what any of them holds)."""
        return [*self.downloads(key), self.published(key)]

    @staticmethod
    def is_published(path: Path) -> bool:
        """Whether ``path`` (one of :meth:`shard_files`) is a published shard, which its
        verified marker covers: nothing may write into it."""
        return path.parent.name == _DATA

    # -- setting up -----------------------------------------------------------------------

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


@dataclass(frozen=True)
class KeyedFolder:
    """A flat folder of per-shard files named ``<key's file name>.<suffix>`` (such as the
    node's folder of processes' memory shard links and block claims).

    >>> KeyedFolder(Path("/peers")).file("v1/shard.00001.mds", "claims")
    PosixPath('/peers/v1%2Fshard.00001.mds.claims')
    """

    root: Path

    def file(self, key: str, suffix: str) -> Path:
        """The file of shard ``key`` with ``suffix`` (which holds no ``.``)."""
        return self.root / f"{key_to_name(key)}.{suffix}"

    def files(self, key: str) -> list[tuple[Path, str]]:
        """Every file of shard ``key`` in the folder, with its suffix (sorted)."""
        stem = str(self.root / key_to_name(key))
        found = []
        for path in sorted(glob.glob(f"{glob.escape(stem)}.*")):
            suffix = path[len(stem) + 1 :]
            if suffix and "." not in suffix:  # not a longer key's file
                found.append((Path(path), suffix))
        return found
