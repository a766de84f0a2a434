"""Keyset pages bounded in bytes as well as in rows.

Runs, checkpoints and versions carry free-form JSON documents (up to
``SHARDSTREAM_MAX_JSON_BYTES`` each), so ``limit=1000`` rows could mean tens of megabytes
parsed, validated and serialized per request, times every concurrent client. A page
therefore also ends once its documents add up to :data:`PAGE_BUDGET_BYTES` (the cursor
continues it), and rows are read a few at a time, so one request holds at most about the
budget plus one chunk, whatever ``limit`` asks. An answer that is one document (a run's
audit) keeps the first entries of each list within the budget, with their full counts
(:func:`capped_lists`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

PAGE_BUDGET_BYTES = 1 << 20
CHUNK_ROWS = 50
MAX_LISTED = 100
"""Entries of one list that a one-document answer holds (:func:`capped_lists`)."""


def json_size(document: object) -> int:
    """Bytes of a stored JSON document as compact JSON (what it costs to hold and send)."""
    return len(json.dumps(document, separators=(",", ":")))


def bounded_page(
    fetch: Callable[[int | None, int], Sequence[T]],
    key: Callable[[T], int],
    size: Callable[[T], int],
    *,
    after: int | None,
    limit: int,
    budget: int = PAGE_BUDGET_BYTES,
) -> tuple[list[T], bool]:
    """Up to ``limit`` rows after ``after``, ending early once their ``size`` reaches
    ``budget`` (never before one row); and whether more rows follow.

    ``fetch(after, n)`` returns at most ``n`` rows with ``key`` above ``after`` (None: from
    the start), in key order.
    """
    shown: list[T] = []
    total = 0
    while True:
        want = min(CHUNK_ROWS, limit - len(shown))
        rows = fetch(after, want + 1)  # one extra row says whether more follow
        for i, row in enumerate(rows[:want]):
            shown.append(row)
            total += size(row)
            if total >= budget:
                return shown, i + 1 < len(rows)
        if len(rows) <= want:
            return shown, False
        if len(shown) == limit:
            return shown, True
        after = key(shown[-1])


def capped_lists(
    document: dict[str, Any],
    counts: Mapping[str, str],
    *,
    budget: int = PAGE_BUDGET_BYTES,
    max_items: int = MAX_LISTED,
) -> dict[str, Any]:
    """``document`` with each list named in ``counts`` cut to its first entries: at most
    ``max_items``, and at most an equal share of ``budget`` bytes (an entry that alone
    exceeds the share is not listed); ``counts[key]`` names the field that keeps the full
    count. For answers that are one document, not pages (the audit's)."""
    share = budget // max(1, len(counts))
    out = dict(document)
    for key, count_key in counts.items():
        items = document.get(key)
        if not isinstance(items, list):
            continue
        kept: list[Any] = []
        used = 0
        for item in items[:max_items]:
            used += json_size(item)
            if used > share:
                break
            kept.append(item)
        out[key] = kept
        out.setdefault(count_key, len(items))
    return out
