"""The audit's answer, bounded: what ``GET /v1/runs/{id}/audit`` and the run page show.

The audit is one report, not a page, and it lists every attempt of the run with its plan
changes, and its rollbacks: for a run of 10,000 attempts it once answered 175 MiB to a
read token. Each of those lists keeps its first entries (at most 100, within about a
megabyte for the three; :func:`~shardstream.server.data.paging.capped_lists`) beside its
full count (``attempt_count``, ``plan_change_count``, ``rollback_count``); every attempt
is in the paged ``GET /v1/runs/{id}/attempts``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from shardstream.server.data import audit as audit_data
from shardstream.server.data.paging import capped_lists

LIST_COUNTS = {
    "attempts": "attempt_count",
    "plan_changes": "plan_change_count",
    "rollbacks": "rollback_count",
}
"""The report's lists that grow with the run's attempts, and the field that keeps each
one's full count (the audit itself bounds its failures, epochs and history segments)."""


def audit(session: Session, run_id: int) -> dict[str, Any]:
    """The audit report of run ``run_id`` (:func:`shardstream.server.data.audit.audit`)
    with its lists capped."""
    return capped_lists(audit_data.audit(session, run_id), LIST_COUNTS)
