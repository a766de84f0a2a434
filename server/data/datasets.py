"""Dataset queries."""

from __future__ import annotations

from sqlalchemy import Select, and_, delete, func, select, update
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError, NotFoundError, RequestValidationError
from shardstream.server.models import DatasetRow, RunRow, RunSourceRow, ShardRow, VersionRow
from shardstream.wire import DatasetCreate, DatasetPublic, Page, check_name


def get(session: Session, name: str) -> DatasetRow:
    """The dataset called ``name``, or 404."""
    row = session.scalars(select(DatasetRow).where(DatasetRow.name == name)).first()
    if row is None:
        raise NotFoundError(f"dataset {name!r} not found", 404)
    return row


def create(session: Session, body: DatasetCreate, *, owner: str) -> DatasetRow:
    """Create a dataset, or 409 if the name is taken."""
    if session.scalars(select(DatasetRow.id).where(DatasetRow.name == body.name)).first():
        raise ConflictError(f"dataset {body.name!r} already exists", 409)
    row = DatasetRow(name=body.name, description=body.description, owner=body.owner or owner)
    session.add(row)
    session.flush()
    return row


def _public_query() -> Select[DatasetRow, int, int | None]:
    stats = (
        select(
            VersionRow.dataset_id.label("dataset_id"),
            func.count().label("num_versions"),
            func.max(VersionRow.number)
            .filter(VersionRow.status == "published")
            .label("latest_published"),
        )
        .group_by(VersionRow.dataset_id)
        .subquery()
    )
    return select(
        DatasetRow,
        func.coalesce(stats.c.num_versions, 0),
        stats.c.latest_published,
    ).outerjoin(stats, stats.c.dataset_id == DatasetRow.id)


def _to_public(row: DatasetRow, num_versions: int, latest: int | None) -> DatasetPublic:
    return DatasetPublic(
        name=row.name,
        description=row.description,
        owner=row.owner,
        created_at=row.created_at,
        num_versions=num_versions,
        latest_published=latest,
    )


def public(session: Session, name: str) -> DatasetPublic:
    """The dataset as returned by the API, with its version counts."""
    found = session.execute(_public_query().where(DatasetRow.name == name)).first()
    if found is None:
        raise NotFoundError(f"dataset {name!r} not found", 404)
    return _to_public(found[0], found[1], found[2])


def page(
    session: Session, *, cursor: str | None, limit: int, allowed: frozenset[str] | None
) -> Page[DatasetPublic]:
    """A page of datasets ordered by name (keyset pagination on the name)."""
    query = _public_query().order_by(DatasetRow.name).limit(limit + 1)
    if cursor:
        try:
            check_name(cursor)
        except ValueError as exc:
            raise RequestValidationError(f"query.cursor: {exc}", 422) from exc
        query = query.where(DatasetRow.name > cursor)
    if allowed is not None:
        query = query.where(DatasetRow.name.in_(sorted(allowed)))
    rows = session.execute(query).all()
    items = [_to_public(r[0], r[1], r[2]) for r in rows[:limit]]
    next_cursor = items[-1].name if len(rows) > limit else None
    return Page[DatasetPublic](items=items, next_cursor=next_cursor)


def delete_dataset(session: Session, name: str, *, force: bool) -> None:
    """Delete a dataset and its versions' metadata (never the stored shards).

    Refused with 409 while a running run reads one of its versions, unless ``force``.
    """
    row = get(session, name)
    if not force:
        users = session.scalars(
            select(RunRow.id)
            .join(RunSourceRow, RunSourceRow.run_id == RunRow.id)
            .where(and_(RunSourceRow.dataset == name, RunRow.status == "running"))
            .distinct()
            .order_by(RunRow.id)
            .limit(11)
        ).all()
        if users:
            shown = ", ".join(str(i) for i in users[:10])
            raise ConflictError(
                f"dataset {name!r} is read by running run(s) {shown}; finish or cancel them, "
                "or delete with ?force=true",
                409,
            )
    # Explicit deletes keep SQLite and PostgreSQL identical even without FK cascades.
    version_ids = select(VersionRow.id).where(VersionRow.dataset_id == row.id)
    session.execute(
        update(RunSourceRow).where(RunSourceRow.version_id.in_(version_ids)).values(version_id=None)
    )
    session.execute(delete(ShardRow).where(ShardRow.version_id.in_(version_ids)))
    session.execute(delete(VersionRow).where(VersionRow.dataset_id == row.id))
    session.execute(delete(DatasetRow).where(DatasetRow.id == row.id))


def count(session: Session) -> int:
    """How many datasets exist (for metrics)."""
    return int(session.scalar(select(func.count()).select_from(DatasetRow)) or 0)
