"""The node-local copy of a server version's shard index.

A published version never changes, so one process per node downloads its index (the
shard keys and their MDS entries, through the paged API) and every other rank, worker and
later start on that node reads the file. A restarting 256-rank job asks the server for
the version, not for 256 copies of a 100,000-shard index.

::

    <cache root>/index/<digest>.json    {"version": 2, "shards": [...], "keys": [...]}

The file is an MDS ``index.json`` plus the shard keys. Its digest covers the server URL,
the dataset, the version number and its publication time, so a dataset deleted and
re-created under the same name never matches an old file. The first process to arrive
downloads under a ``flock`` while the others wait on it, and writes through a temporary
file and an atomic rename: a process killed mid-download leaves no partial index. At most
:data:`KEEP` indexes are kept, the least recently used removed first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardstream.client._filelock import lock_path, unlink_and_close
from shardstream.errors import ConfigError

__all__ = ["KEEP", "cached_index"]

KEEP = 32


def cached_index(cache_root: Path, identity: str, download: Callable[[], Any]) -> Any:
    """The index (a JSON value) named by ``identity``: read from ``cache_root``, or
    ``download()``-ed and stored there.

    Concurrent callers on one node download once: the others wait for the first.
    """
    folder = cache_root / "index"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot use cache directory {cache_root} ({exc.strerror}); set "
            "SHARDSTREAM_CACHE_DIR (or CacheOptions.dir) to a writable local folder"
        ) from exc
    path = folder / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
    data = _read(path)
    if data is not None:
        return json.loads(data)
    fd = lock_path(folder / f"{path.name}.lock", blocking=True)
    assert fd is not None  # blocking
    try:
        data = _read(path)  # downloaded by the process we waited for
        if data is not None:
            return json.loads(data)
        index = download()
        for stale in folder.glob(f".{path.name}.*.tmp"):  # the lock's holder is us:
            _remove(stale)  # these were left by a writer killed before its rename
        tmp = folder / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_bytes(json.dumps(index, separators=(",", ":")).encode())
        os.replace(tmp, path)
        _trim(folder, keep=path)
    finally:
        unlink_and_close(fd, folder / f"{path.name}.lock")
    return index


def _read(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):  # trimmed by another process: the bytes are read
        os.utime(path)  # recently used: trimmed last
    return data


def _trim(folder: Path, *, keep: Path) -> None:
    """Remove the least recently used indexes beyond :data:`KEEP`."""
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".json") and entry.path != str(keep):
            try:
                entries.append((entry.stat().st_mtime, entry.path))
            except FileNotFoundError:
                continue
    for _, old in sorted(entries)[: max(0, len(entries) + 1 - KEEP)]:
        _remove(Path(old))


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
