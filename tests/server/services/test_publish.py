"""Publishing as a use case, called without HTTP: every shard checked, then published
once; a refusal leaves the draft as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shardstream.errors import ConflictError, PermissionDeniedError
from shardstream.server.auth import BOOTSTRAP_ADMIN, Principal
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import versions as versions_data
from shardstream.server.services.parts import ServerParts
from shardstream.server.services.publish import publish
from shardstream.wire import Scope

from .conftest import make_draft


def _status(parts: ServerParts, name: str, number: int) -> str:
    with parts.read_sessions() as session:
        row = versions_data.get(session, datasets_data.get(session, name), number)
        return row.status


def _published_count(parts: ServerParts) -> float:
    value = parts.metrics.registry.get_sample_value("shardstream_version_publishes_total")
    return value or 0.0


def test_publish_checks_storage_then_publishes_once(parts: ServerParts, tmp_path: Path) -> None:
    number = make_draft(parts, tmp_path / "wiki", "wiki", shards=3)
    public = asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "wiki", number))
    assert (public.status, public.num_shards, public.number) == ("published", 3, number)
    assert _status(parts, "wiki", number) == "published"
    assert _published_count(parts) == 1
    again = asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "wiki", number))
    assert again == public  # idempotent: the version as it is, nothing counted twice
    assert _published_count(parts) == 1


def test_a_missing_or_resized_shard_keeps_the_draft(parts: ServerParts, tmp_path: Path) -> None:
    root = tmp_path / "wiki"
    number = make_draft(parts, root, "wiki", shards=3)
    (root / "shard.00001.mds").unlink()
    (root / "shard.00002.mds").write_bytes(b"x" * 11)
    with pytest.raises(ConflictError) as refused:
        asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "wiki", number))
    assert refused.value.status == 409
    message = str(refused.value)
    assert "shard.00001.mds" in message and "shard.00002.mds" in message, message
    assert _status(parts, "wiki", number) == "draft"
    assert _published_count(parts) == 0


def test_a_draft_without_shards_is_refused(parts: ServerParts, tmp_path: Path) -> None:
    number = make_draft(parts, tmp_path / "empty", "empty", shards=0)
    with pytest.raises(ConflictError, match="has no shards"):
        asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "empty", number))


def test_a_token_outside_the_dataset_cannot_publish(parts: ServerParts, tmp_path: Path) -> None:
    number = make_draft(parts, tmp_path / "wiki", "wiki", shards=1)
    other = Principal(name="other", scope=Scope.write, datasets=frozenset({"books"}))
    with pytest.raises(PermissionDeniedError) as refused:
        asyncio.run(publish(parts, other, "wiki", number))
    assert refused.value.status == 403 and "'wiki'" in str(refused.value)
    assert _status(parts, "wiki", number) == "draft"
