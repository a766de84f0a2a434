"""run_input_stats: each rank's input figures per run (is training waiting for data?)

Revision ID: 0007_run_input_stats
Revises: 0006_run_attempts
Create Date: 2026-11-26 18:30:00.000000

Adds ``run_input_stats``: one row per run and rank, updated by the rank's checkpoint
commits (``CheckpointCreate.stats``): its latest window, totals, and the wait share of its
recent commits. A new table only: existing rows are untouched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_run_input_stats"
down_revision = "0006_run_attempts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    op.create_table(
        "run_input_stats",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("wait_share", sa.Float(), nullable=False),
        sa.Column("latest", sa.JSON(), nullable=False),
        sa.Column("total", sa.JSON(), nullable=False),
        sa.Column("history", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank"),
    )


def downgrade() -> None:
    """Revert this migration."""
    op.drop_table("run_input_stats")
