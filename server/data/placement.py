"""Where a version's shards go: the dataset's location, or an admin's in-place registration.

The rules (docs/server.md, "Storage locations"):

- a dataset's location is chosen by the server under its default storage root the first
  time it needs one, and kept (a location outside every configured root is replaced);
- a version the server places lives at ``<dataset location>/v<number>``;
- only an admin may name a version's storage root (registering an existing MDS dataset
  in place), and only strictly inside a configured root and outside every other
  dataset's location and versions.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.errors import ConflictError, PermissionDeniedError, RequestValidationError
from shardstream.server.models import DatasetRow, VersionRow
from shardstream.server.storage.locations import (
    Location,
    LocationError,
    dataset_location,
    inside_roots,
    parse_location,
    version_location,
)


def dataset_home(dataset: DatasetRow, roots: tuple[Location, ...]) -> Location:
    """The dataset's location, assigned (under the default root) if it has none usable."""
    if dataset.location:
        try:
            current = parse_location(dataset.location)
        except LocationError:
            current = None
        if current is not None and inside_roots(current, roots) is not None:
            return current
    home = dataset_location(roots[0], dataset.name)
    dataset.location = home.url
    return home


def placed_root(dataset: DatasetRow, number: int, roots: tuple[Location, ...]) -> str:
    """The storage root the server gives version ``number`` of ``dataset``."""
    return version_location(dataset_home(dataset, roots), number).url


def require_register_right(may_register: bool, field: str) -> None:
    """403 unless the caller may choose a storage root (admins only)."""
    if not may_register:
        raise PermissionDeniedError(
            f"{field}: only an admin token may choose where a version's shards live "
            "(registering a dataset in place); omit it and the server places the version "
            "under the dataset's own storage location",
            403,
        )


def registered_root(
    session: Session,
    dataset: DatasetRow,
    text: str,
    roots: tuple[Location, ...],
    field: str,
    *,
    visible: frozenset[str] | None,
) -> str:
    """Check an admin-chosen storage root and return its canonical URL, or raise.

    422 when it is not a storage location, is outside every configured root or is a root
    itself; 409 when it overlaps another dataset's location or versions. The 409 names
    that dataset only when it is among ``visible`` (the caller's datasets; None: all): an
    admin restricted to some datasets must not learn the others' names this way.
    """
    try:
        wanted = parse_location(text)
    except LocationError as exc:
        raise RequestValidationError(f"{field}: {text!r} is not usable: {exc}", 422) from exc
    root = inside_roots(wanted, roots)
    if root is None:
        allowed = ", ".join(r.url for r in roots)
        raise RequestValidationError(
            f"{field}: {wanted.url} is outside the server's storage roots ({allowed}); "
            "register datasets inside one of them (SHARDSTREAM_STORAGE_ROOTS)",
            422,
        )
    if any(wanted.contains(r) for r in roots):
        # Nested roots: a registration must not take a whole root, where the server
        # places other datasets.
        raise RequestValidationError(
            f"{field}: {wanted.url} is (or contains) a storage root; register a folder inside one",
            422,
        )
    other = _overlapping_dataset(session, dataset, wanted)
    if other is not None:
        whose = f"dataset {other!r}" if visible is None or other in visible else "another dataset"
        raise ConflictError(
            f"{field}: {wanted.url} overlaps the storage of {whose}; a dataset can only be "
            "registered where no other dataset keeps shards",
            409,
        )
    return wanted.url


def _overlapping_dataset(session: Session, dataset: DatasetRow, wanted: Location) -> str | None:
    """The name of another dataset whose location or a version's root overlaps ``wanted``."""
    locations = session.execute(
        select(DatasetRow.name, DatasetRow.location).where(
            DatasetRow.id != dataset.id, DatasetRow.location.is_not(None)
        )
    )
    version_roots = session.execute(
        select(DatasetRow.name, VersionRow.storage_root)
        .join(DatasetRow, DatasetRow.id == VersionRow.dataset_id)
        .where(VersionRow.dataset_id != dataset.id)
        .distinct()
    )
    for name, url in [*locations, *version_roots]:
        try:
            theirs = parse_location(url)
        except LocationError:
            continue  # an old row the server will not serve anyway
        if theirs.overlaps(wanted):
            return str(name)
    return None
