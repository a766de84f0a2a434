"""The audit's answer, bounded: what ``GET /v1/runs/{id}/audit`` and the run page show.

The audit is one report, not a page, and it lists the run's attempts with their plan
changes, its history segments, epochs, rollbacks and failures: for a run of 10,000
attempts it once answered 175 MiB to a read token. Each list keeps its first entries
within about a megabyte in all (:func:`~.paging.capped_lists`), beside its full count
(``attempt_count``, ``plan_change_count``...); every attempt is in the paged
``GET /v1/runs/{id}/attempts``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from . import audit as audit_data
from .paging import capped_lists

LIST_COUNTS = {
    "failures": "failure_count",
    "attempts": "attempt_count",
    "plan_changes": "plan_change_count",
    "rollbacks": "rollback_count",
    "history": "history_count",
    "epochs": "epoch_count",
}
"""Each list of the report, and the field that keeps its full count."""


def audit(session: Session, run_id: int) -> dict[str, Any]:
    """The audit report of run ``run_id`` (:func:`.audit.audit`) with its lists capped."""
    return capped_lists(audit_data.audit(session, run_id), LIST_COUNTS)
