"""Whole-shard downloads that fail their hash are fetched again, a bounded number of times.

A byte flipped on the way (a faulty proxy, a NIC, a bad cache in front of the store) makes
a whole download fail its published hash; a second download usually gets the right bytes.
Only a shard whose bytes are wrong every time is a corrupt stored object, and then one
:class:`~shardstream.errors.HashMismatchError` names the shard and how many downloads
failed. Ranged reads have their own per-range retries (:mod:`~shardstream.client.reads.io`).

>>> data = refetched("s3://bucket/shard.00000.mds", lambda: download_and_verify())
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from shardstream.errors import HashMismatchError

__all__ = ["WHOLE_ATTEMPTS", "refetched"]

log = logging.getLogger(__name__)

WHOLE_ATTEMPTS = 3
"""Downloads of a whole shard before a hash mismatch is final."""

T = TypeVar("T")


def refetched(what: str, attempt: Callable[[], T], attempts: int = WHOLE_ATTEMPTS) -> T:
    """``attempt()`` (one whole download, verified), again while it raises
    :class:`HashMismatchError`, at most ``attempts`` times in all; ``what`` names the
    shard in the warning and in the final error."""
    for n in range(1, attempts + 1):
        try:
            return attempt()
        except HashMismatchError as exc:
            if n == attempts:
                raise HashMismatchError(
                    f"shard {what} failed its hash check in all {attempts} downloads, so the "
                    f"stored object itself is wrong (rebuild or re-upload it): {exc}"
                ) from exc
            log.warning(
                "shard %s failed its hash check (download %d of at most %d), fetching it again: %s",
                what,
                n,
                attempts,
                exc,
            )
    raise AssertionError("unreachable: attempts >= 1")
