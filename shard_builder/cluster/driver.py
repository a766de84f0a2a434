"""The one driver of a Ray build, for every kind: the pipeline's ordered workers on actors.

On a cluster the driver never holds samples. For each unit of the kind (from
:attr:`BuildRun.first` on, a window of ``2 x actors`` ahead) an actor runs the kind's
worker step and returns two references: the unit's count (token counts, sample sizes, bad
inputs: :meth:`~..cut.UnitResult.count`) and its payload, which stays in the object store
of the actor's node. Taking the counts strictly in unit order, the kind's own cut
(:meth:`~..cut.CutKind.cut`, the one a local build applies) says which shards close (so
boundaries never depend on which actor finished first), and :meth:`ActorDriver.write` has
each shard written and uploaded by the actor that holds most of its input; that actor
journals the shard before putting it in place (see :mod:`.worker`), and the driver takes
the stored shards in shard order. A shard a killed run already stored (same position,
same journal record) is taken as it is.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from shardstream.mds import ShardInfo
from shardstream.shard_builder.cluster.connect import RayOptions
from shardstream.shard_builder.cluster.pool import (
    WorkerLostError,
    WorkerPool,
    wait_for_lost_nodes,
    worker_pool,
)
from shardstream.shard_builder.cluster.worker import ShardJob
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.cut import CutKind, CutShard
from shardstream.shard_builder.pipeline import BuildRun, run_build
from shardstream.shard_builder.result import BuildResult, WorkerStats

log = logging.getLogger(__name__)

_MB = 1 << 20


def build_on_pool(
    ray: Any,
    config: OutputOptions,
    options: RayOptions,
    make_kind: Callable[[], CutKind],
    work: Callable[[Any], Any] | None = None,
) -> BuildResult:
    """:func:`~shardstream.shard_builder.pipeline.run_build` of ``make_kind()``, whose
    shards the one Ray driver (:class:`~.driver.ActorDriver`) makes on a pool of worker
    actors, running ``work`` (default: the kind's step) on each unit. While workers are
    lost it runs again from the journal (which holds every shard stored so far; a fresh
    kind each attempt) up to ``options.retries`` times. The result carries each actor's
    numbers and the pool's start-up time (``workers_start_s``)."""
    stats: list[WorkerStats] = []
    timings: dict[str, float] = {}
    nodes: set[str] = set()  # the nodes the attempt's workers ran on

    def produce(kind: CutKind, run: BuildRun) -> None:
        started = time.perf_counter()
        with worker_pool(ray, config, options) as pool:
            nodes.update(pool.nodes)
            timings["workers_start_s"] = time.perf_counter() - started
            ActorDriver(kind, run, pool, work).drive()
            stats.extend(pool.stats())

    for attempt in range(options.retries + 1):
        stats.clear()
        try:
            result = run_build(make_kind(), produce)
            break
        except WorkerLostError as exc:
            if attempt == options.retries:
                raise
            log.warning(
                "%s; resuming from the journal (attempt %d of %d)",
                exc.lost,
                attempt + 2,
                options.retries + 1,
            )
            wait_for_lost_nodes(ray, nodes, options.node_loss_wait_s)
            nodes.clear()
    return replace(
        result,
        workers=tuple(stats),
        timings={**result.timings, **timings},
    )


@dataclass
class _Write:
    position: int
    ref: Any  # the worker's ShardInfo, or None: a shard a killed run stored (``info``)
    info: ShardInfo | None = None


class ActorDriver:
    """One Ray build's driver loop over ``kind``'s units (see the module doc). ``work`` is
    the actors' step on a unit's task (default: the kind's :attr:`~..pipeline.BuildKind.work`;
    a source whose units are Ray Data blocks names the step that reads them)."""

    def __init__(
        self,
        kind: CutKind,
        run: BuildRun,
        pool: WorkerPool,
        work: Callable[[Any], Any] | None = None,
    ) -> None:
        self.kind = kind
        self.run = run
        self.pool = pool
        self.work = work or kind.work
        self.units = len(kind.units)
        self.window = 2 * len(pool)  # units worked on ahead of the cutting
        self._working: dict[int, tuple[Any, Any, int]] = {}  # unit -> count, payload, actor
        self.held: dict[int, tuple[Any, int]] = {}  # counted units a shard still needs
        self._writes: deque[_Write] = deque()

    def drive(self) -> None:
        """Work on every unit, write every shard, take them all in order."""
        next_submit = next_count = self.run.first
        while next_count < self.units:
            while next_submit < self.units and next_submit - next_count < self.window:
                actor = self.pool.least_busy()
                unit = self.kind.units[next_submit]
                task = self.kind.task(next_submit, unit)
                count, payload = self.pool.submit(
                    actor, "work", self.work, task, unit.nbytes, num_returns=2
                )
                self._working[next_submit] = (count, payload, actor)
                next_submit += 1
            if len(self._writes) >= self.window:  # bounds the results waiting in the store
                self._wait_head()
                continue
            count_ref = self._working[next_count][0]
            heads = [count_ref] + [w.ref for w in list(self._writes)[:1] if w.ref is not None]
            ready = self.pool.wait_any(heads)
            self._take_stored(ready)
            if count_ref in ready:
                _, payload_ref, actor = self._working.pop(next_count)
                self.held[next_count] = (payload_ref, actor)
                self.counted(next_count, self.pool.get(count_ref))
                next_count += 1
        if (last := self.kind.cut_last()) is not None:
            self.write(last)
        while self._writes:
            self._wait_head()

    def counted(self, number: int, count: Any) -> None:
        """Unit ``number``'s count (all before it were counted): the kind's cut, then
        :meth:`write` each shard it closed."""
        counted = self.kind.cut(number, count)
        for shard in counted.shards:
            self.write(shard)
        for unit in [u for u in self.held if not self.kind.needed(u)]:
            del self.held[unit]  # no shard needs its payload any more: Ray frees it
        self.run.progress.advance(
            self.kind.units[number].nbytes, counted.samples, counted.out_bytes, **counted.counts
        )

    @property
    def next_position(self) -> int:
        """The position of the next shard to write."""
        return len(self.run.shards) + len(self._writes)

    def write(self, shard: CutShard) -> None:
        """Have ``shard`` written as the next shard, by the actor that holds most of it,
        unless a killed run stored it already (same position, same journal record)."""
        position = self.next_position
        if (stored := self.run.journal.reusable(position, shard.resume)) is not None:
            self._writes.append(_Write(position, None, stored))  # a killed run stored it
            return
        # The actor holding the most of the shard writes it: the least to move.
        shares = shard.shares
        held: dict[int, int] = {}
        for unit, amount in shares.items():
            owner = self.held[unit][1]
            held[owner] = held.get(owner, 0) + amount
        actor = max(held, key=held.__getitem__)
        job = ShardJob(position, shard.pieces, tuple(shares), self.kind.layout, shard.resume)
        payloads = (self.held[unit][0] for unit in shares)
        self._writes.append(_Write(position, self.pool.submit(actor, "write", job, *payloads)))

    def _wait_head(self) -> None:
        """Wait for the shard at the head of the queue, then take what is stored."""
        head = self._writes[0].ref
        self._take_stored(set() if head is None else self.pool.wait_any([head]))

    def _take_stored(self, ready: set[Any]) -> None:
        """Take the stored (and journaled) shards at the head of the queue, in shard order."""
        while self._writes and (
            self._writes[0].ref is None
            or self._writes[0].ref in ready
            or self.pool.wait_any([self._writes[0].ref], timeout=0)
        ):
            write = self._writes.popleft()
            info = write.info if write.ref is None else self.pool.get(write.ref)
            assert info is not None and write.position == len(self.run.shards)
            self.run.took(info)
            self.run.progress.count(shards=1, MB_written=info.stored.bytes / _MB)
