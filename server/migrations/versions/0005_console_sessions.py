"""console_sessions: server-side sessions for the web console

Revision ID: 0005_console_sessions
Revises: 0004_run_owner
Create Date: 2026-11-24 10:00:00.000000

Adds ``console_sessions``: one row per signed-in browser, keyed by the sha256 of a random
session id (the cookie holds the id, never a token secret), bound to the token that
signed in (``token_id``, NULL for the bootstrap admin secret, and ``binding``, an HMAC of
that secret's hash under the session id), with an absolute expiry and the time of its
last request (for the idle timeout). Rows die with their token (``ON DELETE CASCADE``).

A new table only: nothing existing is copied or rewritten. Console cookies from before
this migration held token secrets; they are no session ids, so those browsers are sent to
the sign-in form once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_console_sessions"
down_revision = "0004_run_owner"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Apply this migration."""
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=True),
        sa.Column("binding", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("id_hash"),
    )
    op.create_index("ix_console_sessions_token_id", "console_sessions", ["token_id"])
    op.create_index("ix_console_sessions_expires_at", "console_sessions", ["expires_at"])


def downgrade() -> None:
    """Revert this migration."""
    op.drop_index("ix_console_sessions_expires_at", table_name="console_sessions")
    op.drop_index("ix_console_sessions_token_id", table_name="console_sessions")
    op.drop_table("console_sessions")
