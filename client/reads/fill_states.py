"""Fill states: where each of this process's fills of the node cache's download file stands.

A ranged shard that this process downloads for the node cache is *filled*: its blocks are
written into the cache's download file (:meth:`~.fills.ShardFills.fill_into`), which
the cache publishes once complete. While it runs, the batches read their blocks from that
fill's :class:`~.partial.PartialShard`; once complete, from its reader until the published
file is leased (:class:`~.leases.ShardLeases`). The leases schedule fills, the fills run
them, the demand reads where they stand: three parts, so the state lives here, behind
one private lock, and changes only by the transitions below.

One attempt to fill a shard (:class:`FillAttempt`) only moves up::

    SCHEDULED --run--> RUNNING --complete--> COMPLETE
        |                 |                      |
        +--- give_up -----+------ end ---------- +--- leased / close ---> ENDED

Invariant, per attempt: ``0 <= stage``, never lower than before; ``started`` is set from
``RUNNING`` on (or once a scheduled attempt gave up); ``partial`` is set from ``run`` until
``end`` (the fill's thread is done with the file); ``reader`` is set from ``complete``
until the published file is leased or the read path closes. A new attempt of the same
shard (scheduled again, or a fill a lease started) replaces the last one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardstream.client.reads.partial import PartialShard
    from shardstream.mds import ShardReader

__all__ = ["FillAttempt", "FillStage", "FillStates"]


class FillStage(IntEnum):
    """Where one attempt to fill a shard stands (only moves up)."""

    SCHEDULED = 0
    """Queued on the download threads: readers may wait a moment for it to start."""
    RUNNING = 1
    """Writing the cache's download file: its partial serves the batches' blocks."""
    COMPLETE = 2
    """Verified and complete: its reader serves until the published file is leased."""
    ENDED = 3
    """Over: failed, gave up, or handed over to a lease; nothing to read or wait for."""


@dataclass(eq=False)
class FillAttempt:
    """One attempt to fill one shard (read its fields through :class:`FillStates`)."""

    shard: int
    stage: FillStage
    started: threading.Event = field(default_factory=threading.Event)
    """Set once the fill runs (or the scheduled attempt gave up)."""
    partial: PartialShard | None = None
    reader: ShardReader | None = None


class FillStates:
    """This process's fills of the node cache's download files, by shard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: dict[int, FillAttempt] = {}

    # -- transitions ----------------------------------------------------------------------

    def schedule(self, shard: int) -> FillAttempt:
        """A background fill of ``shard`` is queued: a new attempt, ``SCHEDULED``."""
        attempt = FillAttempt(shard, FillStage.SCHEDULED)
        with self._lock:
            self._current[shard] = attempt
        return attempt

    def run(self, shard: int, partial: PartialShard, scheduled: FillAttempt | None) -> FillAttempt:
        """The fill writes the download file through ``partial`` (``RUNNING``): readers use
        it from now on. ``scheduled`` is the attempt this fill was queued as, ``None`` for a
        fill a lease started itself (a new attempt)."""
        with self._lock:
            attempt = scheduled if scheduled is not None else FillAttempt(shard, FillStage.RUNNING)
            _advance(attempt, FillStage.RUNNING)
            attempt.partial = partial
            self._current[shard] = attempt
        attempt.started.set()  # readers waiting for this fill use it from now on
        return attempt

    def complete(self, attempt: FillAttempt, reader: ShardReader) -> None:
        """The file is complete and verified (``COMPLETE``): ``reader`` serves it."""
        with self._lock:
            _advance(attempt, FillStage.COMPLETE)
            attempt.reader = reader

    def end(self, attempt: FillAttempt) -> None:
        """The fill's thread is done with the file (its partial is no longer read); an
        attempt that did not complete is ``ENDED``."""
        with self._lock:
            attempt.partial = None
            if attempt.reader is None:
                _advance(attempt, FillStage.ENDED)

    def give_up(self, attempt: FillAttempt) -> None:
        """The queued job of ``attempt`` is over: if the fill never ran (the shard was
        cached meanwhile, or the download failed before it), the attempt is ``ENDED``."""
        with self._lock:
            if attempt.stage is FillStage.SCHEDULED:
                _advance(attempt, FillStage.ENDED)
        attempt.started.set()

    def leased(self, shard: int) -> None:
        """The published file of ``shard`` is leased: a completed fill's reader is no
        longer served (``ENDED`` once its fill's thread is done too)."""
        with self._lock:
            attempt = self._current.get(shard)
            if attempt is not None:
                _drop_reader(attempt)

    def close(self) -> None:
        """The read path closes: no completed fill's reader is served any more."""
        with self._lock:
            for attempt in self._current.values():
                _drop_reader(attempt)

    # -- looking ------------------------------------------------------------------------

    def filling(self, shard: int) -> PartialShard | None:
        """The partial of this process's running fill of ``shard``, if one runs."""
        with self._lock:
            attempt = self._current.get(shard)
            return attempt.partial if attempt is not None else None

    def completed(self, shard: int) -> ShardReader | None:
        """The reader of this process's completed fill of ``shard``, until it is leased."""
        with self._lock:
            attempt = self._current.get(shard)
            return attempt.reader if attempt is not None else None

    def serving(self, shard: int) -> ShardReader | PartialShard | None:
        """What serves ``shard`` from this process's fill of it, looked at once: the
        completed fill's reader, else the running fill's partial, else ``None``."""
        with self._lock:
            attempt = self._current.get(shard)
            if attempt is None:
                return None
            return attempt.reader if attempt.reader is not None else attempt.partial

    def starting(self, shard: int) -> threading.Event | None:
        """The event set once this process's fill of ``shard`` runs, if one is queued and
        has not started yet (else ``None``)."""
        with self._lock:
            attempt = self._current.get(shard)
        if attempt is None or attempt.started.is_set():
            return None
        return attempt.started

    def running(self) -> list[PartialShard]:
        """The partials of every running fill."""
        with self._lock:
            return [a.partial for a in self._current.values() if a.partial is not None]

    def stage(self, shard: int) -> FillStage | None:
        """The stage of the last attempt to fill ``shard`` (``None``: none was made)."""
        with self._lock:
            attempt = self._current.get(shard)
            return attempt.stage if attempt is not None else None


def _advance(attempt: FillAttempt, stage: FillStage) -> None:
    """Move ``attempt`` up to ``stage``; a move down is a bug in the read path."""
    if stage < attempt.stage:
        raise RuntimeError(
            f"shard {attempt.shard}: a fill cannot go from {attempt.stage.name} back to "
            f"{stage.name}"
        )
    attempt.stage = stage


def _drop_reader(attempt: FillAttempt) -> None:
    attempt.reader = None
    if attempt.stage is FillStage.COMPLETE and attempt.partial is None:
        _advance(attempt, FillStage.ENDED)
