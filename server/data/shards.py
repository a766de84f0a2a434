"""Shard index queries: keyset pages, streaming, key lookups.

A 100k-shard index is never loaded whole: pages are keyset ranges over the primary key
``(version_id, idx)`` and streaming reads fixed-size chunks the same way.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.errors import NotFoundError
from shardstream.server.models import ShardRow
from shardstream.wire import Page, ShardRecord

from . import decode_cursor


def to_record(row: ShardRow) -> ShardRecord:
    """A shard row as the wire record."""
    return ShardRecord.model_construct(
        index=row.idx,
        key=row.key,
        samples=row.samples,
        raw_bytes=row.raw_bytes,
        stored_bytes=row.stored_bytes,
        compression=row.compression,
        hashes=row.hashes,
        mds=row.mds,
    )


def chunk(session: Session, version_id: int, *, start: int, limit: int) -> list[ShardRow]:
    """Shards ``start <= idx`` of a version, at most ``limit``, in index order."""
    return list(
        session.scalars(
            select(ShardRow)
            .where(ShardRow.version_id == version_id, ShardRow.idx >= start)
            .order_by(ShardRow.idx)
            .limit(limit)
        )
    )


def page(session: Session, version_id: int, *, cursor: str | None, limit: int) -> Page[ShardRecord]:
    """One page of the shard index; the cursor is the next shard index."""
    start = decode_cursor(cursor) or 0
    rows = chunk(session, version_id, start=start, limit=limit + 1)
    items = [to_record(r) for r in rows[:limit]]
    nxt = str(rows[limit].idx) if len(rows) > limit else None
    return Page[ShardRecord](items=items, next_cursor=nxt)


def iter_rows(session: Session, version_id: int, *, chunk_size: int = 2000) -> Iterator[ShardRow]:
    """Every shard of a version in order, fetched ``chunk_size`` rows at a time."""
    start = 0
    while True:
        rows = chunk(session, version_id, start=start, limit=chunk_size)
        yield from rows
        if len(rows) < chunk_size:
            return
        start = rows[-1].idx + 1


def missing_mds(session: Session, version_id: int) -> bool:
    """Whether some shard was registered without its MDS index entry."""
    found = session.scalars(
        select(ShardRow.idx)
        .where(ShardRow.version_id == version_id, ShardRow.mds.is_(None))
        .limit(1)
    ).first()
    return found is not None


def require_keys(session: Session, version_id: int, keys: list[str]) -> None:
    """Raise 404 naming the first of ``keys`` that is not a shard of the version."""
    wanted = set(keys)
    found: set[str] = set()
    ordered = sorted(wanted)
    for i in range(0, len(ordered), 500):
        found.update(
            session.scalars(
                select(ShardRow.key).where(
                    ShardRow.version_id == version_id, ShardRow.key.in_(ordered[i : i + 500])
                )
            )
        )
    missing = [k for k in keys if k not in found]
    if missing:
        raise NotFoundError(f"shard key {missing[0]!r} is not part of this version", 404)
