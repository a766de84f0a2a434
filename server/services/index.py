"""A version's shard index: pages of shard records, and the MDS ``index.json`` whole or
streamed.

Reads here never hold a database connection while a client reads: pages and small
indexes are built in one short session (the routes keep published ones in memory), and
large indexes are streamed chunk by chunk, each chunk in a session of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from shardstream.errors import ConflictError
from shardstream.server.cache.published import VersionSnapshot
from shardstream.server.data import shards as shards_data

INDEX_CHUNK = 1000
"""Shards per database read of a streamed index.json: a reader that stops reading keeps
at most one such chunk (~1 MB) in memory, and no connection."""

INDEX_CACHE_SHARDS = 4_000
"""index.json of a published version up to this many shards (~3 MB at our writer's ~800
bytes per entry) is built once per process and kept with the index pages; larger ones
are streamed from the database every time, never held whole."""


def page_json(
    factory: sessionmaker[Session], version: VersionSnapshot, *, cursor: str | None, limit: int
) -> bytes:
    """One page of ``version``'s shard records in shard order, as the JSON body."""
    with factory() as session:
        return shards_data.page_json(session, version.id, cursor=cursor, limit=limit)


def kept_whole(version: VersionSnapshot) -> bool:
    """Whether ``version``'s index.json is small enough to be built whole and kept."""
    return version.num_shards <= INDEX_CACHE_SHARDS


def require_entries(factory: sessionmaker[Session], version: VersionSnapshot) -> None:
    """409 when ``version`` was registered without MDS index entries (it has no
    index.json; its shard pages are all there is)."""
    with factory() as session:
        if shards_data.missing_mds(session, version.id):
            raise ConflictError(
                f"version {version.number} of {version.dataset!r} was registered without MDS "
                "index entries; page through /shards instead",
                409,
            )


def index_json(factory: sessionmaker[Session], version: VersionSnapshot) -> bytes:
    """``version``'s whole index.json (for versions :func:`kept_whole`)."""
    require_entries(factory, version)
    return b"".join(index_chunks(factory, version))


def index_chunks(factory: sessionmaker[Session], version: VersionSnapshot) -> Iterator[bytes]:
    """``version``'s index.json in pieces of :data:`INDEX_CHUNK` entries.

    Runs after the request's session is closed (a streamed body is sent after the route
    returns), so it opens its own and gives its connection back after every chunk. A
    client that stops reading stalls this generator between two yields; it must then hold
    no connection (nor, on PostgreSQL, an open transaction), or a few stalled readers
    would take the pool. Published versions never change, so chunks read in separate
    sessions fit together. One yield per database chunk: each yield costs a thread hop, so
    never one per shard.
    """
    session = factory()
    try:
        yield b'{"version": 2, "shards": [\n'
        sep = b""
        sent = 0
        for entries in shards_data.iter_mds_chunks(session, version.id, chunk_size=INDEX_CHUNK):
            session.close()  # the next chunk checks a connection out again
            sent += len(entries)
            yield sep + ",\n".join(entries).encode()
            sep = b",\n"
        if sent != version.num_shards:
            # Deleted while streaming: end the body unfinished rather than well-formed
            # but short, so a client never trusts a partial index.
            raise RuntimeError(f"version {version.id} changed while its index was streamed")
        yield b"\n]}\n"
    finally:
        session.close()
