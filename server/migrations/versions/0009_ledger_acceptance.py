"""ledger acceptance: disputed attempts, refused commits, attempt keys reused by a launcher

Revision ID: 0009_ledger_acceptance
Revises: 0008_run_mixture
Create Date: 2026-11-29 08:00:00.000000

Adds ``run_attempts.disputed`` (why the ranks of one start disagreed: its commits are
refused) and ``run_attempts.refused`` (the commits the server refused, which a trainer may
have saved a model at anyway), and turns the unique ``(run_id, key)`` into an index: a
launcher that is started again by hand reuses its ids, and that later start is a new
attempt under the same key. Existing rows keep their values (nothing disputed, nothing
refused).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_ledger_acceptance"
down_revision = "0008_run_mixture"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    with op.batch_alter_table("run_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("disputed", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("refused", sa.JSON(), nullable=True))
        batch_op.drop_constraint("uq_run_attempts_run_key", type_="unique")
        batch_op.create_index("ix_run_attempts_run_key", ["run_id", "key"])


def downgrade() -> None:
    """Revert this migration."""
    with op.batch_alter_table("run_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_run_attempts_run_key")
        batch_op.create_unique_constraint("uq_run_attempts_run_key", ["run_id", "key"])
        batch_op.drop_column("refused")
        batch_op.drop_column("disputed")
