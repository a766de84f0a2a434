"""datasets: the storage location the server chose for each dataset

Revision ID: 0003_storage_locations
Revises: 0002
Create Date: 2026-11-23 14:00:00.000000

Adds ``datasets.location`` (nullable) and fills it for existing datasets whose versions
all sit at ``<P>/v<number>`` for one common ``P`` (the layout the server used for drafts
without a storage root): ``P`` becomes the location. Every other dataset (no versions,
versions placed by clients anywhere, or an inferred location overlapping another
dataset's) keeps NULL, and the server gives it a fresh location under its default root
at its next draft. Existing versions keep their ``storage_root`` as it is; the server
presigns and verifies them only while that root lies inside a configured storage root
(SHARDSTREAM_STORAGE_ROOTS), so rows pointing anywhere else are inert until an operator
adds their root on purpose (see docs/server.md, "Storage locations").

``recreate="never"``: copying ``datasets`` on SQLite (batch mode) would drop the table,
and with foreign keys on that deletes every version pointing at it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_storage_locations"
down_revision = "0002"
branch_labels = None
depends_on = None


def _common_parent(roots: list[tuple[str, int]]) -> str | None:
    """``P`` when every ``(storage_root, number)`` is ``P/v<number>``; else None."""
    parents = set()
    for root, number in roots:
        parent, _, last = root.rstrip("/").rpartition("/")
        if last != f"v{number}" or "://" not in parent or parent.endswith(":/"):
            return None
        parents.add(parent)
    return parents.pop() if len(parents) == 1 else None


def _clashes(inferred: dict[int, str]) -> set[int]:
    """Datasets whose inferred location equals or nests with another's."""
    owners: dict[str, list[int]] = {}
    for dataset_id, parent in inferred.items():
        owners.setdefault(parent, []).append(dataset_id)
    clash = {i for ids in owners.values() if len(ids) > 1 for i in ids}
    for dataset_id, parent in inferred.items():
        scheme, _, path = parent.partition("://")
        segments = path.split("/")
        for depth in range(1, len(segments)):  # every proper ancestor of the location
            ancestor = f"{scheme}://" + "/".join(segments[:depth])
            if ancestor in owners:
                clash.add(dataset_id)
                clash.update(owners[ancestor])
    return clash


def upgrade() -> None:
    """Apply this migration."""
    with op.batch_alter_table("datasets", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("location", sa.Text(), nullable=True))
    conn = op.get_bind()
    versions = sa.table(
        "versions",
        sa.column("dataset_id", sa.Integer),
        sa.column("number", sa.Integer),
        sa.column("storage_root", sa.Text),
    )
    datasets = sa.table("datasets", sa.column("id", sa.Integer), sa.column("location", sa.Text))
    by_dataset: dict[int, list[tuple[str, int]]] = {}
    for dataset_id, number, root in conn.execute(
        sa.select(versions.c.dataset_id, versions.c.number, versions.c.storage_root)
    ):
        by_dataset.setdefault(dataset_id, []).append((root, number))
    inferred = {
        dataset_id: parent
        for dataset_id, roots in by_dataset.items()
        if (parent := _common_parent(roots)) is not None
    }
    # Two datasets whose locations nest or coincide could reach each other's keys.
    clash = _clashes(inferred)
    for dataset_id, parent in inferred.items():
        if dataset_id not in clash:
            conn.execute(
                sa.update(datasets).where(datasets.c.id == dataset_id).values(location=parent)
            )


def downgrade() -> None:
    """Revert this migration."""
    with op.batch_alter_table("datasets", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("location")
