"""run_mixture: a run's mixture over training, per window of global steps

Revision ID: 0008_run_mixture
Revises: 0007_run_input_stats
Create Date: 2026-11-26 21:00:00.000000

Adds ``run_mixture``: one row per run with a mixture schedule, updated by its checkpoint
commits: per finished window of steps, the samples each source gave and the weights the
schedule planned (bounded: windows are merged in pairs past a cap). A new table only:
existing rows are untouched (a run's windows are computed from its latest checkpoint
until its next commit records them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_run_mixture"
down_revision = "0007_run_input_stats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    op.create_table(
        "run_mixture",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("width", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )


def downgrade() -> None:
    """Revert this migration."""
    op.drop_table("run_mixture")
