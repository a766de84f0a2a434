"""Run queries, and who may write a run.

A run belongs to the principal that created it (``RunRow.owner``, server-derived, never
sent by the caller). Committing checkpoints and changing the status need that principal,
or an admin whose rights cover every dataset the run reads; reading needs read access to
all its datasets. Runs from before owners existed (owner NULL) are written by such admins
only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError, NotFoundError, PermissionDeniedError
from shardstream.server.auth import Principal
from shardstream.server.models import DatasetRow, RunRow, RunSourceRow, VersionRow, utcnow
from shardstream.wire import Page, RunCreate, RunPublic, RunSource, RunStatus

from . import ID_MAX, decode_cursor
from .paging import bounded_page, json_size


def get(session: Session, run_id: int, *, lock: bool = False) -> RunRow:
    """The run with ``run_id``, or 404; ``lock`` takes a row lock (PostgreSQL)."""
    query = select(RunRow).where(RunRow.id == run_id)
    if lock:
        query = query.with_for_update()
    row = session.scalars(query).first()
    if row is None:
        raise NotFoundError(f"run {run_id} not found", 404)
    return row


def sources(session: Session, run_id: int) -> list[RunSourceRow]:
    """The versions a run reads, in order."""
    return list(
        session.scalars(
            select(RunSourceRow)
            .where(RunSourceRow.run_id == run_id)
            .order_by(RunSourceRow.position)
        )
    )


def rows_by_id(session: Session, run_ids: Sequence[int]) -> dict[int, RunRow]:
    """The runs with ``run_ids`` (those that exist), by id: one query for a page of runs."""
    return {r.id: r for r in session.scalars(select(RunRow).where(RunRow.id.in_(run_ids)))}


def sources_with_samples(
    session: Session, run_ids: Sequence[int]
) -> dict[int, list[tuple[RunSourceRow, int]]]:
    """Each run's sources in order with their version's samples (0 where the version is
    gone), for every id in ``run_ids``: one query for a page of runs."""
    out: dict[int, list[tuple[RunSourceRow, int]]] = {i: [] for i in run_ids}
    if not run_ids:
        return out
    rows = session.execute(
        select(RunSourceRow, VersionRow.total_samples)
        .outerjoin(VersionRow, VersionRow.id == RunSourceRow.version_id)
        .where(RunSourceRow.run_id.in_(run_ids))
        .order_by(RunSourceRow.run_id, RunSourceRow.position)
    ).all()
    for src, samples in rows:
        out[src.run_id].append((src, int(samples or 0)))
    return out


def to_public(row: RunRow, srcs: list[RunSourceRow]) -> RunPublic:
    """A run as the API returns it."""
    return RunPublic(
        id=row.id,
        name=row.name,
        sources=[RunSource(dataset=s.dataset, version=s.version, weight=s.weight) for s in srcs],
        seed=row.seed,
        global_batch_size=row.global_batch_size,
        plan=row.plan,
        status=RunStatus(row.status),
        created_by=row.created_by,
        owner=row.owner,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def require_readable(session: Session, who: Principal, run_id: int) -> None:
    """404 for an unknown run, 403 when it reads a dataset outside ``who``'s allow-list."""
    get(session, run_id)
    if who.datasets is None:
        return
    for src in sources(session, run_id):
        who.require_dataset(src.dataset)


def named_versions(state: Mapping[str, Any]) -> list[str]:
    """The version ids a reader state (a checkpoint's plan, an attempt's body) names: its
    ``versions``, and those its recorded ``changes`` went from and to."""
    found: list[Any] = []
    if isinstance(state.get("versions"), list):
        found += state["versions"]
    for change in state.get("changes") or []:
        changed = change.get("changed") if isinstance(change, Mapping) else None
        pair = changed.get("versions") if isinstance(changed, Mapping) else None
        for side in pair if isinstance(pair, list) else []:
            found += side if isinstance(side, list) else [side]
    return [v for v in found if isinstance(v, str)]


def require_named_datasets(who: Principal, versions: Iterable[str]) -> None:
    """403 when one of ``versions`` (``dataset@N``) is of a dataset outside ``who``'s
    allow-list, whether that dataset exists or not.

    The audit recomputes epoch sizes from the versions a run's checkpoints name: naming
    another dataset's would make it tell that dataset's sizes (or that it does not exist)
    to a token that may not read it. Ids without ``@`` (a reader of a local path) name no
    dataset of the server.
    """
    if who.datasets is None:
        return
    for version in versions:
        if "@" in version:
            who.require_dataset(version.rpartition("@")[0])


def require_writable(session: Session, who: Principal, run: RunRow) -> None:
    """403 unless ``who`` owns ``run`` or is an admin whose rights cover all its datasets.

    The run's datasets are loaded only for a restricted token (an unrestricted one covers
    them all), so the owner's commits cost no extra query. The scope (``write``) is checked
    by the route.
    """
    covered = who.datasets is None or who.covers(s.dataset for s in sources(session, run.id))
    if covered and (who.is_admin_over(()) or run.owner == who.principal_id):
        return
    owner = "nobody (created before runs had owners)" if run.owner is None else run.owner
    raise PermissionDeniedError(
        f"run {run.id} belongs to {owner}; token {who.name!r} ({who.principal_id}) cannot "
        "change it: only its owner or an admin over all its datasets can",
        403,
    )


def create(session: Session, body: RunCreate, *, created_by: Principal) -> RunPublic:
    """Register a run owned by ``created_by``; every source must be a published version
    (404/409 otherwise) that ``created_by`` may read (403)."""
    for src in body.sources:
        created_by.require_dataset(src.dataset)
    resolved: list[tuple[RunSource, int]] = []
    for src in body.sources:
        found = session.execute(
            select(VersionRow.id, VersionRow.status)
            .join(DatasetRow, DatasetRow.id == VersionRow.dataset_id)
            .where(DatasetRow.name == src.dataset, VersionRow.number == src.version)
        ).first()
        if found is None:
            raise NotFoundError(f"dataset {src.dataset!r} has no version {src.version}", 404)
        if found[1] != "published":
            raise ConflictError(
                f"version {src.version} of {src.dataset!r} is {found[1]}; runs can only read "
                "published versions",
                409,
            )
        resolved.append((src, found[0]))
    now = utcnow()
    row = RunRow(
        name=body.name,
        seed=body.seed,
        global_batch_size=body.global_batch_size,
        plan=body.plan,
        status="running",
        created_by=created_by.name[:128],
        owner=created_by.principal_id,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    session.flush()
    srcs = [
        RunSourceRow(
            run_id=row.id,
            position=i,
            dataset=src.dataset,
            version=src.version,
            version_id=vid,
            weight=src.weight,
        )
        for i, (src, vid) in enumerate(resolved)
    ]
    session.add_all(srcs)
    session.flush()
    return to_public(row, srcs)


def set_status(session: Session, run_id: int, status: RunStatus, *, who: Principal) -> RunPublic:
    """Change a run's status (its owner, or an admin over all its datasets)."""
    row = get(session, run_id, lock=True)
    require_writable(session, who, row)
    row.status = status.value
    row.updated_at = utcnow()
    session.flush()
    return to_public(row, sources(session, run_id))


def page(
    session: Session, *, cursor: str | None, limit: int, allowed: frozenset[str] | None
) -> Page[RunPublic]:
    """A page of runs by id; a restricted token sees runs reading only its datasets.

    Bounded in plan bytes as well as rows (:func:`~.paging.bounded_page`), so listing
    runs with large plans holds little memory whatever ``limit`` is.
    """

    def fetch(after: int | None, n: int) -> Sequence[RunRow]:
        query = select(RunRow).where(RunRow.id > (after or 0)).order_by(RunRow.id).limit(n)
        if allowed is not None:
            outside = exists().where(
                RunSourceRow.run_id == RunRow.id, RunSourceRow.dataset.not_in(sorted(allowed))
            )
            query = query.where(~outside)
        return session.scalars(query).all()

    shown, more = bounded_page(
        fetch,
        lambda r: r.id,
        lambda r: json_size(r.plan),
        after=decode_cursor(cursor, upper=ID_MAX),
        limit=limit,
    )
    by_run: dict[int, list[RunSourceRow]] = {r.id: [] for r in shown}
    if shown:
        for src in session.scalars(
            select(RunSourceRow)
            .where(RunSourceRow.run_id.in_(list(by_run)))
            .order_by(RunSourceRow.run_id, RunSourceRow.position)
        ):
            by_run[src.run_id].append(src)
    items = [to_public(r, by_run[r.id]) for r in shown]
    nxt = str(shown[-1].id) if more else None
    return Page[RunPublic](items=items, next_cursor=nxt)


def count_by_status(session: Session) -> dict[str, int]:
    """Number of runs per status (for metrics)."""
    rows = session.execute(select(RunRow.status, func.count()).group_by(RunRow.status))
    return {status: int(n) for status, n in rows}
