"""Version queries: drafts, shard batches, publish and abort."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError, NotFoundError, RequestValidationError
from shardstream.server.cache.published import VersionSnapshot
from shardstream.server.models import DatasetRow, ShardRow, VersionRow, utcnow
from shardstream.server.storage.locations import (
    Location,
    LocationError,
    check_shard_key,
    parse_location,
)
from shardstream.wire import (
    MAX_INT,
    Page,
    ShardBatch,
    ShardBatchResult,
    ShardRecord,
    VersionCreate,
    VersionPublic,
    VersionUpdate,
)

from . import ID_MAX, decode_cursor
from .paging import bounded_page, json_size
from .placement import placed_root, registered_root, require_register_right


def to_public(row: VersionRow, dataset: str) -> VersionPublic:
    """A version row as returned by the API."""
    return VersionPublic.model_validate(
        {**{c: getattr(row, c) for c in _PUBLIC_COLUMNS}, "dataset": dataset}
    )


_PUBLIC_COLUMNS = [c for c in VersionPublic.model_fields if c != "dataset"]


def snapshot(row: VersionRow, dataset: str) -> VersionSnapshot:
    """A detached copy of what the hot read routes serve (see :mod:`..published`)."""
    published = row.published_at
    return VersionSnapshot(
        id=row.id,
        dataset=dataset,
        number=row.number,
        status=row.status,
        storage_root=row.storage_root,
        published_us=int(published.timestamp() * 1_000_000) if published else None,
        num_shards=row.num_shards,
        public_json=to_public(row, dataset).model_dump_json().encode(),
    )


def get(session: Session, dataset: DatasetRow, number: int, *, lock: bool = False) -> VersionRow:
    """Version ``number`` of ``dataset``, or 404; ``lock`` takes a row lock (PostgreSQL)."""
    query = select(VersionRow).where(
        VersionRow.dataset_id == dataset.id, VersionRow.number == number
    )
    if lock:
        query = query.with_for_update()
    row = session.scalars(query).first()
    if row is None:
        raise NotFoundError(f"dataset {dataset.name!r} has no version {number}", 404)
    return row


def find(session: Session, dataset: str, number: int) -> VersionRow:
    """Version ``number`` of the dataset named ``dataset`` in one query, or 404."""
    row = session.scalars(
        select(VersionRow)
        .join(DatasetRow, DatasetRow.id == VersionRow.dataset_id)
        .where(DatasetRow.name == dataset, VersionRow.number == number)
    ).first()
    if row is None:
        if session.scalars(select(DatasetRow.id).where(DatasetRow.name == dataset)).first() is None:
            raise NotFoundError(f"dataset {dataset!r} not found", 404)
        raise NotFoundError(f"dataset {dataset!r} has no version {number}", 404)
    return row


def latest_published(session: Session, dataset: DatasetRow) -> VersionRow:
    """The newest published version of ``dataset``, or 404."""
    row = session.scalars(
        select(VersionRow)
        .where(VersionRow.dataset_id == dataset.id, VersionRow.status == "published")
        .order_by(VersionRow.number.desc())
        .limit(1)
    ).first()
    if row is None:
        raise NotFoundError(f"dataset {dataset.name!r} has no published version yet", 404)
    return row


def request_digest(body: VersionCreate) -> str:
    """A digest of a draft request as parsed (omitted fields and their defaults agree)."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def create_draft(
    session: Session,
    dataset: DatasetRow,
    body: VersionCreate,
    *,
    created_by: str,
    roots: tuple[Location, ...],
    may_register: bool = False,
    visible: frozenset[str] | None = frozenset(),
    idempotency_key: str | None = None,
) -> tuple[VersionRow, bool]:
    """Open the next-numbered draft at ``<dataset location>/v<number>``.

    ``roots`` are the configured storage roots, the default first. A ``storage_root`` in
    the body (registering in place) needs ``may_register`` (an admin) and must pass
    :func:`.placement.registered_root`; its errors name only ``visible`` datasets (the
    caller's; None: all).

    Returns the row and whether it was created. With an ``idempotency_key`` that an
    earlier draft of this dataset was created with, that draft is returned as it is now
    (``False``) instead of opening another one, so a client that retries after a lost
    answer gets one draft; the same key with another body is a 422.
    """
    # Serialize draft creation per dataset (PostgreSQL; SQLite writers already are), so
    # concurrent requests neither race for the next number nor miss each other's key.
    if body.storage_root is not None:
        require_register_right(may_register, "body.storage_root")
    session.execute(select(DatasetRow.id).where(DatasetRow.id == dataset.id).with_for_update())
    digest = request_digest(body) if idempotency_key is not None else None
    if idempotency_key is not None:
        earlier = session.scalars(
            select(VersionRow).where(
                VersionRow.dataset_id == dataset.id, VersionRow.idempotency_key == idempotency_key
            )
        ).first()
        if earlier is not None:
            if earlier.request_digest != digest:
                raise RequestValidationError(
                    f"header Idempotency-Key: {idempotency_key!r} already created version "
                    f"{earlier.number} of {dataset.name!r} from another request body; send a "
                    "new key for a new draft (a retry must repeat the body exactly)",
                    422,
                )
            return earlier, False
    number = (
        session.scalar(
            select(func.max(VersionRow.number)).where(VersionRow.dataset_id == dataset.id)
        )
        or 0
    ) + 1
    storage_root = (
        registered_root(
            session, dataset, body.storage_root, roots, "body.storage_root", visible=visible
        )
        if body.storage_root is not None
        else placed_root(dataset, number, roots)
    )
    row = VersionRow(
        dataset_id=dataset.id,
        number=number,
        status="draft",
        columns=dict(body.columns),
        storage_root=storage_root,
        builder_config=body.builder_config,
        lineage=body.lineage,
        created_by=created_by,
        num_shards=0,
        total_samples=0,
        total_bytes=0,
        total_raw_bytes=0,
        idempotency_key=idempotency_key,
        request_digest=digest,
    )
    session.add(row)
    session.flush()
    return row, True


def page(
    session: Session, dataset: DatasetRow, *, cursor: str | None, limit: int
) -> Page[VersionPublic]:
    """A page of a dataset's versions, by number; bounded in ``builder_config`` and
    ``lineage`` bytes as well as rows (:func:`~.paging.bounded_page`)."""

    def fetch(after: int | None, n: int) -> Sequence[VersionRow]:
        return session.scalars(
            select(VersionRow)
            .where(VersionRow.dataset_id == dataset.id, VersionRow.number > (after or 0))
            .order_by(VersionRow.number)
            .limit(n)
        ).all()

    rows, more = bounded_page(
        fetch,
        lambda r: r.number,
        lambda r: json_size(r.builder_config) + json_size(r.lineage),
        after=decode_cursor(cursor, upper=ID_MAX),
        limit=limit,
    )
    items = [to_public(r, dataset.name) for r in rows]
    nxt = str(items[-1].number) if more else None
    return Page[VersionPublic](items=items, next_cursor=nxt)


def _require_draft(row: VersionRow, dataset: str, action: str) -> None:
    if row.status != "draft":
        raise ConflictError(
            f"cannot {action} version {row.number} of {dataset!r}: it is {row.status}; "
            "published versions are immutable, create a new draft instead",
            409,
        )


def _same_location(given: str, current: str) -> bool:
    try:
        return parse_location(given).url == current
    except LocationError:
        return False


def update_draft(
    session: Session,
    dataset: DatasetRow,
    number: int,
    body: VersionUpdate,
    *,
    roots: tuple[Location, ...],
    may_register: bool = False,
    visible: frozenset[str] | None = frozenset(),
) -> VersionRow:
    """Change a draft's columns, config, lineage, or (admins, while it has no shards)
    storage root; repeating the draft's own storage root is allowed to anyone. Errors
    name only ``visible`` datasets (the caller's; None: all)."""
    row = get(session, dataset, number, lock=True)
    _require_draft(row, dataset.name, "change")
    if body.storage_root is not None and not _same_location(body.storage_root, row.storage_root):
        require_register_right(may_register, "body.storage_root")
        root = registered_root(
            session, dataset, body.storage_root, roots, "body.storage_root", visible=visible
        )
        if root != row.storage_root and row.num_shards:
            raise ConflictError(
                f"version {number} of {dataset.name!r} already has {row.num_shards} shards "
                f"under {row.storage_root}; its storage root can no longer change",
                409,
            )
        row.storage_root = root
    if body.columns is not None:
        row.columns = dict(body.columns)
    if body.builder_config is not None:
        row.builder_config = body.builder_config
    if body.lineage is not None:
        row.lineage = body.lineage
    session.flush()
    return row


def _same(row: ShardRow, rec: ShardRecord) -> bool:
    return (row.key, row.samples, row.raw_bytes, row.stored_bytes, row.compression) == (
        rec.key,
        rec.samples,
        rec.raw_bytes,
        rec.stored_bytes,
        rec.compression,
    ) and dict(row.hashes) == rec.hashes


def add_shards(
    session: Session, dataset: DatasetRow, number: int, batch: ShardBatch
) -> ShardBatchResult:
    """Append a batch of shards to a draft.

    Indexes must be consecutive and continue from the draft's shard count; a batch that
    repeats already-registered shards identically is accepted (a retried request).
    """
    row = get(session, dataset, number, lock=True)
    _require_draft(row, dataset.name, "add shards to")
    shards = batch.shards
    first = shards[0].index
    for offset, rec in enumerate(shards):
        if rec.index != first + offset:
            raise RequestValidationError(
                f"body.shards[{offset}].index: expected {first + offset} (indexes in a batch "
                f"must be consecutive), got {rec.index}",
                422,
            )
    keys = [s.key for s in shards]
    for offset, key in enumerate(keys):
        problem = check_shard_key(key)
        if problem is not None:
            raise RequestValidationError(
                f"body.shards[{offset}].key: {key!r} is not a key under the version's storage "
                f"location: {problem}",
                422,
            )
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise RequestValidationError(f"body.shards: key {dup!r} appears twice in the batch", 422)
    if first > row.num_shards:
        raise ConflictError(
            f"shard index {first} skips ahead: the draft holds {row.num_shards} shards, so the "
            f"next batch must start at index {row.num_shards}",
            409,
        )
    existing_end = min(row.num_shards, first + len(shards))
    if first < row.num_shards:  # a retry: the overlapping part must match exactly
        stored = session.scalars(
            select(ShardRow)
            .where(
                ShardRow.version_id == row.id, ShardRow.idx >= first, ShardRow.idx < existing_end
            )
            .order_by(ShardRow.idx)
        ).all()
        for old, rec in zip(stored, shards, strict=False):
            if not _same(old, rec):
                raise ConflictError(
                    f"shard index {rec.index} is already registered with different content "
                    f"(key {old.key!r}); the next new index is {row.num_shards}",
                    409,
                )
    new = shards[existing_end - first :]
    if new:
        taken = session.scalars(
            select(ShardRow.key).where(
                ShardRow.version_id == row.id, ShardRow.key.in_([s.key for s in new])
            )
        ).first()
        if taken is not None:
            raise ConflictError(f"shard key {taken!r} is already registered in this draft", 409)
        session.execute(
            insert(ShardRow),
            [
                {
                    "version_id": row.id,
                    "idx": s.index,
                    "key": s.key,
                    "samples": s.samples,
                    "raw_bytes": s.raw_bytes,
                    "stored_bytes": s.stored_bytes,
                    "compression": s.compression,
                    "hashes": s.hashes,
                    "mds": s.mds,
                }
                for s in new
            ],
        )
        totals = (
            row.total_samples + sum(s.samples for s in new),
            row.total_bytes + sum(s.stored_bytes for s in new),
            row.total_raw_bytes + sum(s.raw_bytes for s in new),
        )
        if max(totals) > MAX_INT:  # the columns are 64-bit; the request is rolled back
            raise RequestValidationError(
                f"body.shards: the draft's total samples or bytes would exceed {MAX_INT} "
                "(2**62); a version's totals must fit a 64-bit integer",
                422,
            )
        row.num_shards += len(new)
        row.total_samples, row.total_bytes, row.total_raw_bytes = totals
    session.flush()
    return ShardBatchResult(
        num_shards=row.num_shards, total_samples=row.total_samples, total_bytes=row.total_bytes
    )


def mark_published(
    session: Session, dataset: DatasetRow, number: int, *, num_shards: int, storage_root: str
) -> VersionRow:
    """Flip a checked draft to published; 409 if it changed since it was checked.

    Shards are only ever appended to a draft, so the same count and storage root mean
    the checked shard list is still the draft's.
    """
    row = get(session, dataset, number, lock=True)
    if row.status == "published":
        return row
    _require_draft(row, dataset.name, "publish")
    if row.num_shards != num_shards or row.storage_root != storage_root:
        raise ConflictError(
            f"version {number} of {dataset.name!r} gained shards while it was being checked; "
            "publish again",
            409,
        )
    row.status = "published"
    row.published_at = utcnow()
    session.flush()
    return row


def abort(session: Session, dataset: DatasetRow, number: int) -> VersionRow:
    """Abort a draft (idempotent); its shard rows are dropped, the objects are left alone."""
    row = get(session, dataset, number, lock=True)
    if row.status == "aborted":
        return row
    _require_draft(row, dataset.name, "abort")
    row.status = "aborted"
    session.execute(delete(ShardRow).where(ShardRow.version_id == row.id))
    session.flush()
    return row


def count_by_status(session: Session) -> dict[str, int]:
    """Number of versions per status (for metrics)."""
    rows = session.execute(select(VersionRow.status, func.count()).group_by(VersionRow.status))
    return {status: int(n) for status, n in rows}
