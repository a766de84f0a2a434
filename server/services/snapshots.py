"""A version as the hot read paths see it: a snapshot from memory once published."""

from __future__ import annotations

from shardstream.errors import ConflictError
from shardstream.server.cache.published import VersionSnapshot
from shardstream.server.data import versions as versions_data

from .parts import ServerParts


async def version_snapshot(parts: ServerParts, name: str, number: int) -> VersionSnapshot:
    """Version ``number`` of ``name``: from memory when published, else from the database
    (404 when there is no such version)."""

    def load() -> VersionSnapshot:
        with parts.read_sessions() as session:
            return versions_data.snapshot(versions_data.find(session, name, number), name)

    return await parts.published.version(name, number, load)


def published_only(version: VersionSnapshot, what: str) -> None:
    """409 unless ``version`` is published."""
    if not version.published:
        raise ConflictError(
            f"version {version.number} of {version.dataset!r} is {version.status}; {what} is "
            "served for published versions only",
            409,
        )
