"""The driver's journal records, written by a few threads.

On S3 a record is one small PUT (~20-30 ms to first byte); written one at a time they would
cap a cluster build at ~40 shards per second. Records may land in any order: a re-run
reuses the longest prefix of recorded shards, and :meth:`RecordWriter.close` waits for all
of them before the build writes its index and deletes the journal.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardstream.mds import ShardInfo
from shardstream.shard_builder.journal import BuildJournal


class RecordWriter:
    """Writes ``journal`` records in the background, at most ``threads`` at a time."""

    def __init__(self, journal: BuildJournal, threads: int = 8) -> None:
        self._journal = journal
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="journal")
        self._pending: list[Future[None]] = []

    def record(self, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
        """Record shard ``position`` (stored already); raises an earlier record's error."""
        self._collect(wait=False)
        self._pending.append(self._pool.submit(self._journal.record, position, info, resume))

    def close(self) -> None:
        """Wait for every record; re-raise the first error."""
        try:
            self._collect(wait=True)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _collect(self, *, wait: bool) -> None:
        done = [f for f in self._pending if wait or f.done()]
        self._pending = [f for f in self._pending if f not in done]
        for future in done:
            future.result()
