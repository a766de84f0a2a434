"""The driver's loop of a Ray build, once for every kind: the pipeline's ordered workers on actors.

On a cluster the driver never holds samples. For each unit of the kind (from
:attr:`BuildRun.first` on, a window of ``2 x actors`` ahead) an actor returns two
references: a small count (sizes, documents, bad inputs) and the unit's result, which stays
in the object store of the actor's node. Taking the counts strictly in unit order, the kind
cuts shards from sizes alone (so boundaries never depend on which actor finished first),
and :meth:`ActorDriver.write` has each shard written and uploaded by the actor that holds
most of its input; that actor journals the shard before putting it in place (see
:mod:`.worker`), and the driver takes the stored shards in shard order. A shard a killed
run already stored (same position, same journal record) is taken as it is.

A kind supplies :meth:`~ActorDriver.call` (the actor method for a unit),
:meth:`~ActorDriver.counted` (a unit's count, in order: cut and :meth:`~ActorDriver.write`)
and :meth:`~ActorDriver.finish` (the last shard).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shardstream.mds import ShardInfo
from shardstream.shard_builder.cluster.pool import WorkerPool
from shardstream.shard_builder.pipeline import BuildRun

_MB = 1 << 20


@dataclass
class _Write:
    position: int
    ref: Any  # the worker's ShardInfo, or None: a shard a killed run stored (``info``)
    info: ShardInfo | None = None


class ActorDriver(ABC):
    """One Ray build's driver loop over ``units`` units of work (see the module doc)."""

    def __init__(self, run: BuildRun, pool: WorkerPool, units: int) -> None:
        self.run = run
        self.pool = pool
        self.units = units
        self.window = 2 * len(pool)  # units worked on ahead of the cutting
        self._working: dict[int, tuple[Any, Any, int]] = {}  # unit -> count, result, actor
        self.held: dict[int, tuple[Any, int]] = {}  # counted units a shard still needs
        self._writes: deque[_Write] = deque()

    @abstractmethod
    def call(self, number: int) -> tuple[str, tuple[Any, ...]]:
        """The actor method and arguments that work on unit ``number`` (two returns:
        its count, its result)."""

    @abstractmethod
    def counted(self, number: int, count: Any) -> None:
        """Unit ``number``'s count (all before it were counted): cut, :meth:`write`."""

    @abstractmethod
    def finish(self) -> None:
        """After the last unit's count: :meth:`write` the last shard."""

    def drive(self) -> None:
        """Work on every unit, write every shard, take them all in order."""
        next_submit = next_count = self.run.first
        while next_count < self.units:
            while next_submit < self.units and next_submit - next_count < self.window:
                actor = self.pool.least_busy()
                method, args = self.call(next_submit)
                count, result = self.pool.submit(actor, method, *args, num_returns=2)
                self._working[next_submit] = (count, result, actor)
                next_submit += 1
            if len(self._writes) >= self.window:  # bounds the results waiting in the store
                self._wait_head()
                continue
            count_ref = self._working[next_count][0]
            heads = [count_ref] + [w.ref for w in list(self._writes)[:1] if w.ref is not None]
            ready = self.pool.wait_any(heads)
            self._take_stored(ready)
            if count_ref in ready:
                _, result_ref, actor = self._working.pop(next_count)
                self.held[next_count] = (result_ref, actor)
                self.counted(next_count, self.pool.get(count_ref))
                next_count += 1
        self.finish()
        while self._writes:
            self._wait_head()

    @property
    def next_position(self) -> int:
        """The position of the next shard to write."""
        return len(self.run.shards) + len(self._writes)

    def write(
        self, resume: dict[str, Any], shares: Mapping[int, int], method: str, shard: Any
    ) -> None:
        """Have the next shard (``shard``, for actor ``method``) written: ``shares`` maps
        each unit it takes samples of, in order, to how much it takes; the units' results
        follow ``shard`` as arguments. ``resume`` is its journal record."""
        position = self.next_position
        if (stored := self.run.journal.reusable(position, resume)) is not None:
            self._writes.append(_Write(position, None, stored))  # a killed run stored it
            return
        # The actor holding the most of the shard writes it: the least to move.
        held: dict[int, int] = {}
        for unit, amount in shares.items():
            owner = self.held[unit][1]
            held[owner] = held.get(owner, 0) + amount
        actor = max(held, key=held.__getitem__)
        results = (self.held[unit][0] for unit in shares)
        self._writes.append(_Write(position, self.pool.submit(actor, method, shard, *results)))

    def release(self, needed: Callable[[int], bool]) -> None:
        """Drop the results of the units no shard needs any more: Ray frees them."""
        for unit in [u for u in self.held if not needed(u)]:
            del self.held[unit]

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
