"""Bytes that fail their hash are fetched again, a bounded number of times, with backoff.

A byte flipped on the way (a faulty proxy, a NIC, a bad cache in front of the store) makes
a download fail its published hash; a second download usually gets the right bytes. Only
a shard whose bytes are wrong every time is a corrupt stored object, and then one
:class:`~shardstream.errors.HashMismatchError` names the shard and how many downloads
failed. Whole downloads (:func:`refetched`) and ranged reads
(:mod:`~shardstream.client.reads.io`) re-fetch under the one policy here, :data:`REFETCH`,
which waits a little between fetches (the project's retry policy,
:mod:`shardstream.retry`): a proxy that just garbled a response is not asked again at once.

>>> data = refetched("s3://bucket/shard.00000.mds", lambda: download_and_verify())
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from shardstream.errors import HashMismatchError
from shardstream.retry import RetryPolicy

__all__ = ["REFETCH", "REFETCH_ATTEMPTS", "refetched"]

log = logging.getLogger(__name__)

REFETCH_ATTEMPTS = 3
"""Fetches of the same bytes (a whole shard, or one range of it) before a hash mismatch is
final."""

REFETCH = RetryPolicy(attempts=REFETCH_ATTEMPTS, base_s=0.1, cap_s=1.0, jitter=0.5)
"""How corrupt bytes are fetched again: :data:`REFETCH_ATTEMPTS` fetches in all, waiting
0.05-0.1 s, then 0.1-0.2 s between them."""

T = TypeVar("T")


def refetched(what: str, attempt: Callable[[], T], policy: RetryPolicy = REFETCH) -> T:
    """``attempt()`` (one whole download, verified), again while it raises
    :class:`HashMismatchError`, as often as ``policy`` allows; ``what`` names the shard in
    the warning and in the final error."""
    attempts = policy.start()
    while True:
        try:
            return attempt()
        except HashMismatchError as exc:
            made, delay = attempts.made, attempts.next_delay()
            if delay is None:
                raise HashMismatchError(
                    f"shard {what} failed its hash check in all {made} downloads, so the "
                    f"stored object itself is wrong (rebuild or re-upload it): {exc}"
                ) from exc
            log.warning(
                "shard %s failed its hash check (download %d of at most %s), fetching it again: %s",
                what,
                made,
                policy.attempts or "unbounded",
                exc,
            )
            time.sleep(delay)
