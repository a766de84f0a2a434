"""The node-local copy of a server version's shard index.

A published version never changes, so one process per node downloads its index (the
shard keys and their MDS entries, through the paged API) and every other rank, worker and
later start on that node reads the file. A restarting 256-rank job asks the server for
the version, not for 256 copies of a 100,000-shard index.

::

    <cache root>/index/<digest>.json    the index in a compact form (below), with the keys

The server's MDS entries repeat every shard's column schema and spell out every field
name (~700 bytes a shard); the file keeps each distinct schema once and a shard as one
short row, so a 100,000-shard index reads back in a fraction of the time. It is written
only after the entries were validated, and read back without validating them again.
Its digest covers the server URL,
the dataset, the version number, the version's id and its publication time, so a dataset
deleted and re-created under the same name never matches an old file. The first process to arrive
downloads under a ``flock`` while the others wait on it, and writes through a temporary
file and an atomic rename: a process killed mid-download leaves no partial index. At most
:data:`KEEP` indexes are kept, the least recently used removed first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardstream.client.cache.filelock import lock_path, unlink_and_close
from shardstream.client.cache.layout import CacheLayout
from shardstream.client.cache.private_paths import write_private
from shardstream.errors import ConfigError
from shardstream.mds import FileInfo, MDSIndex, ShardInfo

__all__ = ["KEEP", "cached_index", "decode", "encode"]

log = logging.getLogger(__name__)

KEEP = 32


def cached_index(
    cache_root: Path, identity: str, download: Callable[[], tuple[MDSIndex, list[str]]]
) -> tuple[MDSIndex, list[str]]:
    """The index and shard keys named by ``identity``: read from ``cache_root``, or
    ``download()``-ed and stored there.

    Concurrent callers on one node download once: the others wait for the first.
    """
    layout = CacheLayout.at(cache_root)
    folder = layout.index
    layout.create(folder)
    path = folder / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
    cached = _load(path)
    if cached is not None:
        return cached
    fd = lock_path(folder / f"{path.name}.lock", blocking=True)
    assert fd is not None  # blocking
    try:
        cached = _load(path)  # downloaded by the process we waited for
        if cached is not None:
            return cached
        index, keys = download()
        for stale in folder.glob(f".{path.name}.*.tmp"):  # the lock's holder is us:
            _remove(stale)  # these were left by a writer killed before its rename
        write_private(path, encode(index, keys))
        _trim(folder, keep=path)
    finally:
        unlink_and_close(fd, folder / f"{path.name}.lock")
    return index, keys


_FORMAT = "shardstream-node-index"


def encode(index: MDSIndex, keys: list[str]) -> bytes:
    """The compact file form of a validated index and its keys."""
    schemas: dict[tuple[Any, ...], int] = {}
    rows = []
    for shard in index.shards:
        schema = (
            shard.column_names,
            shard.column_encodings,
            shard.column_sizes,
            shard.compression,
            shard.hashes,
            shard.size_limit,
        )
        z = shard.zip_data
        rows.append(
            [
                schemas.setdefault(schema, len(schemas)),
                shard.samples,
                *_file(shard.raw_data),
                *(_file(z) if z is not None else (None, None, None)),
            ]
        )
    obj = {"format": _FORMAT, "version": 1, "schemas": list(schemas), "shards": rows}
    obj["keys"] = keys
    return json.dumps(obj, separators=(",", ":")).encode()


def decode(data: bytes, path: Path) -> tuple[MDSIndex, list[str]]:
    """The index and keys from :func:`encode`'s bytes (a ConfigError naming ``path`` if
    the file is not one)."""
    try:
        obj = json.loads(data)
        if obj.get("format") != _FORMAT or obj.get("version") != 1:
            raise ValueError(f"not a {_FORMAT} v1 file")
        schemas = [
            (tuple(n), tuple(e), tuple(z), c, tuple(h), limit)
            for n, e, z, c, h, limit in obj["schemas"]
        ]
        shards = []
        for s, samples, rb, rn, rh, zb, zn, zh in obj["shards"]:
            names, encodings, sizes, compression, hashes, size_limit = schemas[s]
            shards.append(
                ShardInfo(
                    column_encodings=encodings,
                    column_names=names,
                    column_sizes=sizes,
                    compression=compression,
                    hashes=hashes,
                    raw_data=FileInfo(rb, rn, rh),
                    samples=samples,
                    size_limit=size_limit,
                    zip_data=None if zb is None else FileInfo(zb, zn, zh),
                )
            )
        keys = obj["keys"]
        if len(keys) != len(shards):
            raise ValueError("keys and shards differ in number")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ConfigError(
            f"the cached dataset index {path} is damaged ({exc}); delete it to download it again"
        ) from None
    return MDSIndex(shards), keys


def _file(info: FileInfo) -> tuple[str, int, dict[str, str]]:
    return info.basename, info.bytes, dict(info.hashes)


def _load(path: Path) -> tuple[MDSIndex, list[str]] | None:
    """The cached index at ``path``; None if there is none or it is damaged (removed, so
    that it is downloaded again)."""
    data = _read(path)
    if data is None:
        return None
    try:
        return decode(data, path)
    except ConfigError as exc:
        log.warning("%s", exc)
        _remove(path)
        return None


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
