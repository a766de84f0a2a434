"""Resolve a :class:`Source` to its shard list and the store that serves the shards.

Two kinds of source:

* a dataset named on the server (``name`` or ``name@version``): the server gives the
  version id, its shard list and presigned URLs, so training nodes need no bucket
  credentials (:class:`~shardstream.storage.HTTPStore` re-resolves expired URLs);
* the URL of an MDS ``index.json`` (``s3://``, ``https://``, ``file://`` or a path), read
  with no server; the shards live in the index's folder.

A :class:`ResolvedSource` is plain, picklable data. Store clients (boto3, httpx) are not
shared across processes: :meth:`ResolvedSource.store` opens one per process, lazily, so a
forked or spawned DataLoader worker never reuses its parent's connections.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardstream.client.options import CacheOptions, ServerOptions, Source
from shardstream.errors import ConfigError, ObjectNotFoundError
from shardstream.hashing import SUPPORTED_HASHES, choose_verify_algo
from shardstream.mds import MDSIndex, ShardInfo, load_index
from shardstream.storage import ObjectStore, open_store

__all__ = [
    "ResolvedSource",
    "check_hashes",
    "resolve_source",
    "split_index_url",
    "unverifiable_shards",
]

log = logging.getLogger(__name__)

_INDEX = "index.json"


@dataclass
class ResolvedSource:
    """A source pinned to one immutable version: its shards and where to fetch them.

    ``version_id`` is the server's version id, or for an ``index.json`` URL a digest of the
    URL and the index bytes (so a rewritten index is a different version). ``root`` is the
    store URL of the shard folder (URL sources); ``server`` / ``dataset`` locate a server
    source. ``keys`` are the stored objects' keys, one per shard. ``scope`` names the
    immutable content the node cache may share between runs (see :meth:`cache_key`);
    empty means ``version_id``.
    """

    source: Source
    version_id: str
    index: MDSIndex
    keys: list[str]
    root: str | None = None
    server: str | None = None
    dataset: str | None = None
    token: str | None = field(default=None, repr=False)
    scope: str = ""
    _store: ObjectStore | None = field(default=None, repr=False, compare=False)
    _store_pid: int = field(default=-1, repr=False, compare=False)

    @property
    def shards(self) -> list[ShardInfo]:
        """The version's shards, in order."""
        return self.index.shards

    def cache_key(self, shard: int) -> str:
        """The node-cache key of a shard: its content identity, readable in ``ls``.

        ``<scope>/<algo>-<published digest>/<basename>``: the scope changes with the
        server, the dataset's identity (a re-created name is another dataset) and the
        version, or with the bucket and index bytes of a URL source; the digest changes
        with the shard's bytes. So no other content can ever hit this entry. A shard
        published without a usable hash is keyed by the scope alone.
        """
        raw = self.shards[shard].raw_data
        algo = choose_verify_algo(raw.hashes)
        content = "unhashed" if algo is None else f"{algo}-{raw.hashes[algo]}"
        return f"{self.scope or self.version_id}/{content}/{raw.basename}"

    def store(self) -> ObjectStore:
        """This process's store for the shards (opened on first use after a fork)."""
        if self._store is None or self._store_pid != os.getpid():
            self._store = self._open_store()
            self._store_pid = os.getpid()
        return self._store

    def _open_store(self) -> ObjectStore:
        if self.root is not None:
            return open_store(self.root)
        from shardstream.client.sources.named import presigning_store

        if self.server is None or self.dataset is None:
            raise ConfigError(f"source {self.source.uri!r} has neither a root nor a server")
        return presigning_store(self.server, self.dataset, self.version_id, self.token)

    def __getstate__(self) -> dict[str, Any]:
        # Live clients hold sockets and locks; the child opens its own.
        state = dict(self.__dict__)
        state["_store"] = None
        state["_store_pid"] = -1
        return state


def split_index_url(uri: str) -> tuple[str, str]:
    """Split ``.../index.json`` (or a folder) into (folder URL, index key)."""
    trimmed = uri.rstrip("/")
    if trimmed.endswith(".json"):
        folder, _, name = trimmed.rpartition("/")
        if not folder:
            folder = "."
        return folder, name
    return trimmed, _INDEX


def resolve_source(
    source: Source,
    server: ServerOptions | None = None,
    cache_root: Path | None = None,
    *,
    require_hashes: bool = False,
) -> ResolvedSource:
    """Pin ``source`` to a version and load its shard list (one index read, or the
    server's index through the node cache at ``cache_root``, default the default cache).

    Shards whose index records no hash the client can compute cannot be checked: a
    warning names them (once per version and process), or with ``require_hashes`` a
    :class:`ConfigError` refuses them.
    """
    if source.is_url:
        resolved = _resolve_url(source)
    else:
        from shardstream.client.sources.named import resolve_named

        root = cache_root if cache_root is not None else CacheOptions().root
        resolved = resolve_named(source, server or ServerOptions(), root)
    check_hashes(resolved, require=require_hashes)
    return resolved


_WARNED: set[str] = set()


def unverifiable_shards(resolved: ResolvedSource) -> list[str]:
    """Basenames of shards with no hash we can compute for their bytes (neither the raw
    file's nor, for compressed shards, the downloaded file's)."""
    bad = []
    for shard in resolved.shards:
        zipped = shard.zip_data
        if choose_verify_algo(shard.raw_data.hashes) is None and (
            zipped is None or choose_verify_algo(zipped.hashes) is None
        ):
            bad.append(shard.raw_data.basename)
    return bad


def check_hashes(resolved: ResolvedSource, *, require: bool) -> None:
    """Warn about (or, with ``require``, refuse) shards that cannot be verified."""
    bad = unverifiable_shards(resolved)
    if not bad:
        return
    what = (
        f"source {resolved.source.uri!r}: {len(bad)} of {len(resolved.shards)} shards "
        f"(first: {bad[0]}) record no hash shardstream can compute "
        f"({', '.join(SUPPORTED_HASHES)}), so their bytes cannot be checked"
    )
    if require:
        raise ConfigError(
            f"{what}; rebuild the dataset with hashes (shardstream build writes sha1 and "
            "xxh3_64), or set CacheOptions(require_hashes=False) to read it unchecked"
        )
    if resolved.version_id not in _WARNED:
        _WARNED.add(resolved.version_id)
        log.warning(
            "%s: a corrupt download or cached copy would be read as is (warned once per "
            "dataset; CacheOptions(require_hashes=True) refuses such data)",
            what,
        )


def _resolve_url(source: Source) -> ResolvedSource:
    folder, name = split_index_url(source.uri)
    if "://" not in folder:
        folder = str(Path(folder).expanduser().resolve())
    store = open_store(folder)
    try:
        raw = store.read_bytes(name)
    except ObjectNotFoundError as exc:
        raise ConfigError(
            f"source {source.uri!r}: no {name} at {folder}; give the URL of an MDS "
            "index.json (or its folder), or a dataset name on the server"
        ) from exc
    index = load_index(raw)
    if not index.shards:
        raise ConfigError(f"source {source.uri!r}: {name} lists no shards")
    canonical = store.url("").rstrip("/")  # file:///x, /x and x/index.json are one source
    digest = hashlib.sha1(canonical.encode() + b"\0" + raw).hexdigest()[:16]
    keys = [shard.stored.basename for shard in index.shards]
    resolved = ResolvedSource(source, f"idx-{digest}", index, keys, root=folder)
    resolved._store, resolved._store_pid = store, os.getpid()
    return resolved
