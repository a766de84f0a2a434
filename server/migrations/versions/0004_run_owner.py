"""runs: the principal that owns each run

Revision ID: 0004_run_owner
Revises: 0003_storage_locations
Create Date: 2026-11-23 14:10:00.000000

Adds ``runs.owner`` (nullable): the principal that created the run, ``token:<id>`` or
``admin`` (the bootstrap admin secret). Only the owner, or an admin whose rights cover
every dataset the run reads, may commit checkpoints to it or change its status.

Existing runs keep NULL: who created them was recorded only as a token *name*
(``created_by``), and names are neither unique nor proof of identity, so guessing an owner
from them could hand a run to the wrong token. A run without an owner can be read as
before and written only by an admin whose rights cover all its datasets; such an admin
can keep a legacy job going or mark it finished.

``recreate="never"``: copying ``runs`` on SQLite (batch mode) would drop the table, and
with foreign keys on that deletes every checkpoint and run source pointing at it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_run_owner"
down_revision = "0003_storage_locations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    with op.batch_alter_table("runs", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("owner", sa.String(length=64), nullable=True))


def downgrade() -> None:
    """Revert this migration."""
    with op.batch_alter_table("runs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("owner")
