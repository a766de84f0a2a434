"""run_attempts: the consumption ledger (every start of a run, and who committed what)

Revision ID: 0006_run_attempts
Revises: 0005_console_sessions
Create Date: 2026-11-26 18:00:00.000000

Adds ``run_attempts``: one row per start of a run (its topology, the checkpoint it resumed
from and the attempt that committed it, the data position it started at, a rollback's
abandoned latest step, the order algorithm, plan fingerprint and accepted plan changes).
Adds ``checkpoints.attempt`` (the attempt that committed the checkpoint) and
``checkpoints.superseded_by`` (the attempt whose rollback abandoned it), both nullable:
checkpoints from before the ledger belong to no attempt, and the audit says so.

``recreate="never"``: copying ``checkpoints`` on SQLite (batch mode) is not needed to add
nullable columns and would rewrite every checkpoint.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_run_attempts"
down_revision = "0005_console_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    op.create_table(
        "run_attempts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("world_size", sa.BigInteger(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=True),
        sa.Column("resumed_step", sa.BigInteger(), nullable=True),
        sa.Column("resumed_attempt", sa.Integer(), nullable=True),
        sa.Column("start_epoch", sa.BigInteger(), nullable=False),
        sa.Column("start_sample", sa.BigInteger(), nullable=False),
        sa.Column("rolled_back_from", sa.BigInteger(), nullable=True),
        sa.Column("algorithm", sa.Integer(), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "number", name="uq_run_attempts_run_number"),
        sa.UniqueConstraint("run_id", "key", name="uq_run_attempts_run_key"),
    )
    with op.batch_alter_table("checkpoints", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("superseded_by", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Revert this migration."""
    with op.batch_alter_table("checkpoints", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("superseded_by")
        batch_op.drop_column("attempt")
    op.drop_table("run_attempts")
