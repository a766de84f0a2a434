"""versions: the Idempotency-Key a draft was created with

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 07:30:00.000000

Two nullable columns and a unique index: plain ALTER TABLE ADD COLUMN and CREATE INDEX on
both databases. ``recreate="never"`` because copying ``versions`` on SQLite (alembic's
batch mode) would drop the old table, and with foreign keys on that deletes every shard
and run source that points at it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    with op.batch_alter_table("versions", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("request_digest", sa.String(length=64), nullable=True))
        batch_op.create_index(
            "ix_versions_dataset_idempotency_key", ["dataset_id", "idempotency_key"], unique=True
        )


def downgrade() -> None:
    """Revert this migration."""
    with op.batch_alter_table("versions", schema=None, recreate="never") as batch_op:
        batch_op.drop_index("ix_versions_dataset_idempotency_key")
        batch_op.drop_column("request_digest")
        batch_op.drop_column("idempotency_key")
