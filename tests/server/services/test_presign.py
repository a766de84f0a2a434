"""Presigning and the shard index as use cases, called without HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.request import urlopen

import pytest

from shardstream.errors import ConflictError, NotFoundError
from shardstream.server.auth import BOOTSTRAP_ADMIN
from shardstream.server.services import index
from shardstream.server.services.parts import ServerParts
from shardstream.server.services.presign import presign_urls
from shardstream.server.services.publish import publish
from shardstream.server.services.snapshots import version_snapshot

from .conftest import make_draft


def test_presign_signs_known_keys_of_published_versions(parts: ServerParts, tmp_path: Path) -> None:
    number = make_draft(parts, tmp_path / "wiki", "wiki", shards=2, size=7)
    key = "shard.00001.mds"
    with pytest.raises(ConflictError, match="published versions only"):
        asyncio.run(presign_urls(parts, BOOTSTRAP_ADMIN, "wiki", number, keys=[key]))
    asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "wiki", number))
    signed = asyncio.run(
        presign_urls(parts, BOOTSTRAP_ADMIN, "wiki", number, keys=[key, key], expires_s=60)
    )
    assert list(signed.urls) == [key]
    with urlopen(signed.urls[key]) as body:  # a local root's file:// URL
        assert body.read() == b"x" * 7
    with pytest.raises(NotFoundError, match=r"'other\.mds'"):
        asyncio.run(presign_urls(parts, BOOTSTRAP_ADMIN, "wiki", number, keys=["other.mds"]))


def test_index_json_needs_mds_entries(parts: ServerParts, tmp_path: Path) -> None:
    number = make_draft(parts, tmp_path / "wiki", "wiki", shards=2)
    asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "wiki", number))
    version = asyncio.run(version_snapshot(parts, "wiki", number))
    assert index.kept_whole(version)
    with pytest.raises(ConflictError, match="without MDS index entries"):
        index.index_json(parts.read_sessions, version)
    page = index.page_json(parts.read_sessions, version, cursor=None, limit=10)
    assert b"shard.00001.mds" in page
