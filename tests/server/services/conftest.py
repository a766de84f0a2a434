"""Fixtures for the use cases: the parts of an app that is built but never asked over
HTTP, and a dataset whose draft is made through the data layer."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI

from shardstream.server.auth import BOOTSTRAP_ADMIN
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import versions as versions_data
from shardstream.server.services.parts import ServerParts
from shardstream.wire import DatasetCreate, ShardBatch, ShardRecord, VersionCreate


@pytest.fixture
def parts(app: FastAPI) -> ServerParts:
    """The server's parts as a use case takes them (no request is ever made)."""
    return ServerParts.of(app.state)


def make_draft(parts: ServerParts, root: Path, name: str, *, shards: int, size: int = 10) -> int:
    """Create ``name`` and a draft listing ``shards`` shards of ``size`` bytes under
    ``root`` (written there too); returns the draft's number."""
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(shards):
        key = f"shard.{i:05d}.mds"
        (root / key).write_bytes(b"x" * size)
        records.append(
            ShardRecord(
                index=i,
                key=key,
                samples=3,
                raw_bytes=size,
                stored_bytes=size,
                hashes={"sha1": f"{i:040x}"},
            )
        )
    with parts.write_sessions() as session:
        datasets_data.create(session, DatasetCreate(name=name), owner=BOOTSTRAP_ADMIN.name)
        dataset = datasets_data.get(session, name)
        draft, _ = versions_data.create_draft(
            session,
            dataset,
            VersionCreate(columns={"x": "int"}, storage_root=root.as_uri()),
            created_by=BOOTSTRAP_ADMIN.name,
            roots=parts.settings.resolved_storage_roots,
            may_register=True,
            visible=None,
        )
        number = draft.number
        if records:
            versions_data.add_shards(session, dataset, number, ShardBatch(shards=records))
        session.commit()
    return number
