"""Datasets named on the metadata server: a name pinned to a published version, its index.

A ``Source("name@3", server=...)`` resolves here to a :class:`ResolvedSource` whose shards the
server presigns (or, for a server keeping shards in a local folder, that folder). Reading an
``index.json`` URL never comes here.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from shardstream.api_client import APIClient
from shardstream.client.options import ServerOptions, Source
from shardstream.client.sources.index_cache import cached_index
from shardstream.client.sources.source import ResolvedSource
from shardstream.errors import ConfigError
from shardstream.mds import MDSIndex, index_from_json
from shardstream.storage import HTTPStore, ObjectStore
from shardstream.wire import VersionStatus

__all__ = ["api_client", "parse_name", "presigning_store", "resolve_named"]

_PAGE = 10_000  # shards per index page (the server's maximum)


def api_client(url: str, token: str | None) -> APIClient:
    return APIClient(url, token)


def parse_name(uri: str) -> tuple[str, int | None]:
    """``"name"`` -> (name, None: latest published); ``"name@3"`` -> (name, 3)."""
    name, sep, version = uri.partition("@")
    if not sep or version in ("", "latest"):
        return name, None
    try:
        return name, int(version.removeprefix("v"))
    except ValueError:
        raise ConfigError(
            f"source {uri!r}: the version after '@' must be a version number (e.g. {name}@3) "
            "or 'latest'"
        ) from None


def resolve_named(source: Source, server: ServerOptions, cache_root: Path) -> ResolvedSource:
    """Pin a server dataset to its version, with the shard keys and the MDS index.

    The index comes from the node's cache when a process on this node has read the
    version before (see :mod:`~shardstream.client.sources.index_cache`); otherwise from the
    server's paged shard index, once per node.
    """
    url, token = server.resolved_url(), server.resolved_token()
    name, number = parse_name(source.uri)
    with api_client(url, token) as api:
        version = api.latest_version(name) if number is None else api.get_version(name, number)
        if version.status is not VersionStatus.published or version.published_at is None:
            raise ConfigError(
                f"dataset {name}@{version.number} is {version.status.value}; only "
                "published versions can be read (publish it, or name a published version)"
            )
        # Everything that tells this version's content apart from any other's: the
        # server, the dataset (a re-created name gets a new version id and publication
        # time), the version. Shards are keyed by it in the node cache, with their hash.
        identity = "\0".join(
            [url, name, str(version.number), str(version.id), version.published_at.isoformat()]
        )
        where = f"dataset {name}@{version.number}"
        index, keys = cached_index(
            cache_root, identity, lambda: _download_index(api, name, version.number, where)
        )
    # Presigned URLs exist for object stores; a server keeping shards in a local folder
    # (the laptop default) hands out that folder, which this node reads directly.
    local_root = version.storage_root if _is_local(version.storage_root) else None
    return ResolvedSource(
        source,
        f"{name}@{version.number}",
        index,
        keys,
        root=local_root,
        server=url,
        dataset=name,
        token=token,
        scope="srv-" + hashlib.sha256(identity.encode()).hexdigest()[:16],
    )


def _download_index(
    api: APIClient, name: str, number: int, where: str
) -> tuple[MDSIndex, list[str]]:
    """The version's MDS index (validated) and shard keys, from the paged shard index."""
    shards: list[Any] = []
    keys: list[str] = []
    for page in api.iter_shard_pages(name, number, page_size=_PAGE):
        for record in page:
            if record.get("mds") is None:
                raise ConfigError(
                    f"{where}: shard {record.get('key')!r} was registered without its MDS "
                    "index entry, which readers need; register the dataset from its "
                    "index.json (shardstream register)"
                )
            if record.get("index") != len(keys):
                raise ConfigError(
                    f"{where}: the server sent shard {record.get('index')} where shard "
                    f"{len(keys)} was expected; retry, or report a server bug"
                )
            shards.append(record["mds"])
            keys.append(str(record["key"]))
    return index_from_json({"version": 2, "shards": shards}, where), keys


def _is_local(root: str) -> bool:
    return root.startswith("file://") or "://" not in root


def presigning_store(server: str, dataset: str, version_id: str, token: str | None) -> ObjectStore:
    """A read-only store whose URLs the server presigns (refreshed when they expire)."""
    name, number = parse_name(version_id)
    if number is None:
        raise ConfigError(f"version id {version_id!r} names no version number")
    api = api_client(server, token)
    return HTTPStore(
        lambda keys: api.presign(name, number, keys), name=f"{dataset}@{number} on {server}"
    )
