"""run_input_totals: each run's input figures over all its ranks, for /metrics

Revision ID: 0010_run_input_totals
Revises: 0009_ledger_acceptance
Create Date: 2026-11-30 09:00:00.000000

Adds ``run_input_totals``: one row per run with a reporting rank, kept by each rank's
commit (ranks per latest verdict, the largest world size reported, the sums ``/metrics``
exports), so a scrape reads one row per run instead of every rank's. Existing runs are
counted from their ``run_input_stats`` rows here, each rank's totals held to their
bounds and the sums saturated as the server does (the bounds are written out below: a
migration computes the same whatever a later release changes).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0010_run_input_totals"
down_revision = "0009_ledger_acceptance"
branch_labels = None
depends_on = None

_VERDICTS = ("unknown", "not_input_bound", "io_bound", "cpu_bound")
_SECONDS = {"data_wait_s": 1e12, "step_s": 1e12}
_COUNTS = {
    name: 2**62
    for name in (
        "storage_bytes",
        "storage_requests",
        "throttled",
        "retries",
        "cache_hits",
        "cache_misses",
    )
}


def upgrade() -> None:
    """Apply this migration."""
    totals = op.create_table(
        "run_input_totals",
        sa.Column("run_id", sa.Integer(), nullable=False),
        *(sa.Column(f"ranks_{v}", sa.Integer(), nullable=False) for v in _VERDICTS),
        sa.Column("world_size", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in _SECONDS),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in _COUNTS),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )
    ranks = sa.table(
        "run_input_stats",
        sa.column("run_id", sa.Integer()),
        sa.column("world_size", sa.Integer()),
        sa.column("verdict", sa.String()),
        sa.column("total", sa.JSON()),
    )
    runs: dict[int, dict[str, Any]] = {}
    found = op.get_bind().execute(
        sa.select(ranks.c.run_id, ranks.c.world_size, ranks.c.verdict, ranks.c.total)
    )
    for run_id, world_size, stored_verdict, total in found:
        row = runs.setdefault(run_id, _empty(run_id))
        verdict = stored_verdict if stored_verdict in _VERDICTS else "unknown"
        row[f"ranks_{verdict}"] += 1
        row["world_size"] = max(row["world_size"], int(world_size))
        for name, limit in _SECONDS.items():
            row[name] = min(row[name] + _held(total, name, limit, float), limit)
        for name, limit in _COUNTS.items():
            row[name] = min(row[name] + _held(total, name, limit, int), limit)
    if runs:
        op.bulk_insert(totals, list(runs.values()))


def _empty(run_id: int) -> dict[str, Any]:
    row: dict[str, Any] = {"run_id": run_id, "world_size": 0}
    row.update({f"ranks_{v}": 0 for v in _VERDICTS})
    row.update({name: 0.0 for name in _SECONDS})
    row.update({name: 0 for name in _COUNTS})
    return row


def _held(total: Any, name: str, limit: float, kind: type[Any]) -> Any:
    """A rank's stored total of ``name`` within ``[0, limit]`` (0 where it is not a number)."""
    value = total.get(name, 0) if isinstance(total, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return kind(0)
    return kind(min(max(value, 0), limit))


def downgrade() -> None:
    """Revert this migration."""
    op.drop_table("run_input_totals")
