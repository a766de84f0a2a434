"""Publishing a draft version: every shard checked in storage, then one short write.

Publishing is atomic (docs/server.md): a version becomes visible only once every shard
it lists exists in storage with its stated size. No database connection is held while
storage is checked: the shard list is read in one short session, checked within
``SHARDSTREAM_STORAGE_DEADLINE_S`` (504 after), and a second short transaction publishes
the draft if it did not change meanwhile.
"""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool

from shardstream.errors import ConflictError
from shardstream.server.auth import Principal
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import shards as shards_data
from shardstream.server.data import versions as versions_data
from shardstream.server.storage.stores import confined_root, verify_within
from shardstream.wire import VersionPublic

from .parts import ServerParts


async def publish(parts: ServerParts, who: Principal, name: str, number: int) -> VersionPublic:
    """Publish version ``number`` of dataset ``name`` for ``who`` (a writer), or answer it
    as it is when it is published already (publishing is idempotent).

    403 outside ``who``'s datasets; 409 when the version is aborted, has no shards, or a
    shard is missing or has another size in storage; 503 while too many publishes check
    storage already, 504 past the storage deadline.
    """
    who.require_dataset(name)
    what = f"version {number} of {name!r}"

    def load() -> tuple[VersionPublic | None, str, list[tuple[str, int]]]:
        with parts.read_sessions() as session:
            row = versions_data.get(session, datasets_data.get(session, name), number)
            if row.status == "published":
                return versions_data.to_public(row, name), row.storage_root, []
            if row.status != "draft":
                raise ConflictError(f"{what} is {row.status}; it cannot be published", 409)
            if row.num_shards == 0:
                raise ConflictError(f"{what} has no shards; add shards before publishing", 409)
            shards = [(s.key, s.stored_bytes) for s in shards_data.iter_rows(session, row.id)]
            return None, row.storage_root, shards

    done, root, shards = await run_in_threadpool(load)
    if done is not None:
        return done
    settings = parts.settings
    confined_root(root, settings.resolved_storage_roots, what)
    store = parts.stores.get(root)
    await verify_within(parts.stores, store, shards, settings.storage_deadline_s, what)

    def mark() -> VersionPublic:
        with parts.write_sessions() as session:
            dataset = datasets_data.get(session, name)
            published = versions_data.mark_published(
                session, dataset, number, num_shards=len(shards), storage_root=root
            )
            public = versions_data.to_public(published, name)
            session.commit()
            return public

    # SQLite has one writer at a time: queue on the app's write gate like other writes.
    async with parts.write_turn():
        public = await run_in_threadpool(mark)
    parts.metrics.publishes.inc()
    return public
