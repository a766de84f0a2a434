"""Shard index queries: keyset pages, streaming, key lookups.

A 100k-shard index is never loaded whole: pages are keyset ranges over the primary key
``(version_id, idx)`` and streaming reads fixed-size chunks the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Set

from sqlalchemy import Text, asc, cast, desc, select
from sqlalchemy.orm import Session

from shardstream.errors import NotFoundError
from shardstream.server.models import ShardRow

from . import decode_cursor


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


SORTS = {"idx": ShardRow.idx, "samples": ShardRow.samples, "bytes": ShardRow.raw_bytes}
"""The orders a version's shards can be listed in by :func:`sorted_rows` (by name)."""


def sorted_rows(
    session: Session, version_id: int, *, sort: str, descending: bool, offset: int, limit: int
) -> list[ShardRow]:
    """At most ``limit`` shards of a version after the first ``offset`` in the order
    :data:`SORTS` names ``sort`` (ties by index): the console's sortable shard table.
    Offset pages, unlike the API's keyset pages: a person jumps to page 40 of a sort."""
    key = SORTS[sort]
    ordering = (desc(key) if descending else asc(key), ShardRow.idx)
    rows = session.scalars(
        select(ShardRow)
        .where(ShardRow.version_id == version_id)
        .order_by(*ordering)
        .offset(offset)
        .limit(limit)
    )
    return list(rows)


# The JSON columns are read as their stored text and spliced into the page as is: parsing
# them only to serialize them again was most of the cost of a 10,000-shard page.
_RECORD_COLUMNS = (
    ShardRow.idx,
    ShardRow.key,
    ShardRow.samples,
    ShardRow.raw_bytes,
    ShardRow.stored_bytes,
    ShardRow.compression,
    cast(ShardRow.hashes, Text),
    cast(ShardRow.mds, Text),
)


def page_json(session: Session, version_id: int, *, cursor: str | None, limit: int) -> bytes:
    """One page of the shard index as ``Page[ShardRecord]`` JSON bytes.

    The hot path of every training job's start-up: plain column tuples, the JSON columns
    as stored text, no ORM objects and no pydantic (the schema is the same; a test checks
    it against ``Page[ShardRecord]``).
    """
    start = decode_cursor(cursor) or 0
    rows = session.execute(
        select(*_RECORD_COLUMNS)
        .where(ShardRow.version_id == version_id, ShardRow.idx >= start)
        .order_by(ShardRow.idx)
        .limit(limit + 1)
    ).all()
    dumps = json.dumps
    items = ",".join(
        f'{{"index":{r[0]},"key":{dumps(r[1])},"samples":{r[2]},"raw_bytes":{r[3]},'
        f'"stored_bytes":{r[4]},"compression":{dumps(r[5])},"hashes":{r[6] or "{}"},'
        f'"mds":{r[7] or "null"}}}'
        for r in rows[:limit]
    )
    nxt = dumps(str(rows[limit][0])) if len(rows) > limit else "null"
    return f'{{"items":[{items}],"next_cursor":{nxt}}}'.encode()


def iter_rows(session: Session, version_id: int, *, chunk_size: int = 2000) -> Iterator[ShardRow]:
    """Every shard of a version in order, fetched ``chunk_size`` rows at a time."""
    start = 0
    while True:
        rows = chunk(session, version_id, start=start, limit=chunk_size)
        yield from rows
        if len(rows) < chunk_size:
            return
        start = rows[-1].idx + 1


def iter_mds_chunks(
    session: Session, version_id: int, *, chunk_size: int = 5000
) -> Iterator[list[str]]:
    """The shards' MDS index entries in order as JSON text, ``chunk_size`` at a time
    (keyset reads)."""
    start = 0
    while True:
        rows = session.execute(
            select(ShardRow.idx, cast(ShardRow.mds, Text))
            .where(ShardRow.version_id == version_id, ShardRow.idx >= start)
            .order_by(ShardRow.idx)
            .limit(chunk_size)
        ).all()
        if rows:
            yield [r[1] or "null" for r in rows]
        if len(rows) < chunk_size:
            return
        start = rows[-1][0] + 1


def missing_mds(session: Session, version_id: int) -> bool:
    """Whether some shard was registered without its MDS index entry."""
    found = session.scalars(
        select(ShardRow.idx)
        .where(ShardRow.version_id == version_id, ShardRow.mds.is_(None))
        .limit(1)
    ).first()
    return found is not None


def all_keys(session: Session, version_id: int) -> frozenset[str]:
    """Every shard key of the version."""
    return frozenset(session.scalars(select(ShardRow.key).where(ShardRow.version_id == version_id)))


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
    require_known(keys, found)


def require_known(keys: list[str], known: Set[str]) -> None:
    """Raise 404 naming the first of ``keys`` that is not in ``known`` (a version's keys)."""
    for key in keys:
        if key not in known:
            raise NotFoundError(f"shard key {key!r} is not part of this version", 404)
