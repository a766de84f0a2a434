"""The driver's side of the worker actors: starting them, giving them work, their errors.

Work goes to the least busy actor (or, for a shard, to the actor whose node holds most of
its input); the driver keeps only object references and small results. Ray's errors are
translated here, once: an error the builder raised in a worker (bad input) comes out as
itself, a lost worker, node or object as one :class:`ShardstreamError` saying that the
finished shards are kept and a re-run resumes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from shardstream.errors import ConfigError, ShardstreamError
from shardstream.shard_builder.cluster.connect import RayOptions, worker_env
from shardstream.shard_builder.cluster.worker import BuildWorker
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.result import WorkerStats

log = logging.getLogger(__name__)

_GRACE_S = 15.0
_RESUME = "the finished shards are kept: run the same command again to resume"


class WorkerLostError(ShardstreamError):
    """A worker actor, its node or an object it held was lost: a re-run resumes.

    ``error`` is the name of Ray's error, ``detail`` the first line of its message; a
    build that retries logs :attr:`lost` before it resumes.
    """

    def __init__(self, error: str, detail: str) -> None:
        self.error = error
        self.detail = detail
        super().__init__(f"{self.lost}; {_RESUME}")

    @property
    def lost(self) -> str:
        """What was lost, in words (the message without its advice)."""
        return f"a Ray worker or its node was lost during the build ({self.error}: {self.detail})"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.error, self.detail)


def wait_for_lost_nodes(ray: Any, nodes: set[str], budget_s: float) -> None:
    """Until each of ``nodes`` runs a task (it is alive: only a worker was lost) or Ray has
    declared it dead, at most ``budget_s``: a retry started at once would still see a lost
    node alive (Ray's health checks take their time) and place a worker on it, which then
    fails too and spends another retry."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ping = ray.remote(num_cpus=0, max_retries=0)(_ping)
    pending = {
        ping.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(): n
        for n in nodes
    }
    declared: list[str] = []
    failed: set[Any] = set()  # pings that could not run: their node is gone, once Ray says so
    deadline = time.monotonic() + budget_s
    while pending and time.monotonic() < deadline:
        if waiting := [ref for ref in pending if ref not in failed]:
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0.5)
        else:
            ready = []
            time.sleep(0.5)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:  # could not run there: wait until Ray declares the node dead
                failed.add(ref)
            else:
                pending.pop(ref)  # it ran: the node is alive (only a worker was lost)
        dead = {n["NodeID"] for n in ray.nodes() if not n["Alive"]}
        for ref, node in list(pending.items()):
            if node in dead:
                pending.pop(ref)
                declared.append(node[:8])
    if declared:
        log.info("Ray declared the lost node(s) dead: %s", ", ".join(sorted(declared)))
    if pending:
        log.warning(
            "Ray still counts node(s) %s alive after %.0f s though they do not answer; "
            "resuming anyway",
            ", ".join(sorted(n[:8] for n in pending.values())),
            budget_s,
        )


def _ping() -> None:
    """A task that only shows its node runs tasks."""


class WorkerPool:
    """The build's worker actors (one CPU each), spread over the cluster's nodes; ``nodes``
    holds the Ray node each runs on."""

    def __init__(self, ray: Any, actors: list[Any], nodes: list[str]) -> None:
        self._ray = ray
        self.actors = actors
        self.nodes = nodes
        self._busy: dict[Any, int] = {}  # pending result -> actor number

    def __len__(self) -> int:
        return len(self.actors)

    def least_busy(self) -> int:
        """The number of the actor with the fewest unfinished calls."""
        self._forget_finished()
        load = [0] * len(self.actors)
        for number in self._busy.values():
            load[number] += 1
        return min(range(len(load)), key=load.__getitem__)

    def submit(self, number: int, method: str, *args: Any, num_returns: int = 1) -> Any:
        """Call ``method`` of actor ``number``; returns its reference(s)."""
        call = getattr(self.actors[number], method)
        refs = call.options(num_returns=num_returns).remote(*args)
        self._busy[refs[0] if num_returns > 1 else refs] = number
        return refs

    def _forget_finished(self) -> None:
        if self._busy:
            ready, _ = self._ray.wait(
                list(self._busy), num_returns=len(self._busy), timeout=0, fetch_local=False
            )
            for ref in ready:
                del self._busy[ref]

    def get(self, ref: Any) -> Any:
        """The value of ``ref``, with Ray's errors translated (see the module doc)."""
        with translate_errors(self._ray):
            return self._ray.get(ref)

    def wait_any(self, refs: Sequence[Any], timeout: float = 0.5) -> set[Any]:
        """The references of ``refs`` that are ready (waits at most ``timeout``)."""
        with translate_errors(self._ray):
            ready, _ = self._ray.wait(list(refs), num_returns=1, timeout=timeout, fetch_local=False)
        return set(ready)

    def settle(self, timeout: float = 30.0) -> None:
        """Wait (at most ``timeout``) for the calls still running or queued: a build that
        stops on an error deletes its partial output only after no worker writes into it."""
        if self._busy:
            self._ray.wait(list(self._busy), num_returns=len(self._busy), timeout=timeout)
            self._busy.clear()

    def stats(self) -> list[WorkerStats]:
        """Each actor's numbers (actors that died are left out)."""
        out = []
        for actor in self.actors:
            try:
                out.append(self._ray.get(actor.stats.remote(), timeout=30))
            except Exception as exc:  # a dead actor: its numbers are lost, the build is not
                log.warning("no statistics from a worker: %s", exc)
        return out


@contextmanager
def translate_errors(ray: Any) -> Iterator[None]:
    """Re-raise Ray's errors as the builder's (see the module doc)."""
    exceptions = ray.exceptions
    try:
        yield
    except exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, ShardstreamError):
            raise cause from None
        raise ShardstreamError(
            f"a Ray worker failed: {type(cause).__name__}: {cause}; {_RESUME}"
        ) from exc
    except (
        exceptions.RayActorError,
        exceptions.ObjectLostError,
        exceptions.WorkerCrashedError,
        exceptions.NodeDiedError,
        exceptions.OwnerDiedError,
    ) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkerLostError(type(exc).__name__, first) from exc
    except exceptions.RayError as exc:
        raise ShardstreamError(f"Ray failed during the build ({exc}); {_RESUME}") from exc


@contextmanager
def worker_pool(ray: Any, config: OutputOptions, options: RayOptions) -> Iterator[WorkerPool]:
    """Start the worker actors for the block, then stop them (also when the build fails:
    no worker keeps writing into an output the driver gave up)."""
    cpus = int(ray.cluster_resources().get("CPU", 0))
    wanted = options.workers or cpus
    if wanted < 1:
        raise ConfigError(f"the Ray cluster at {options.address!r} has no CPUs for workers")
    actor_class = ray.remote(num_cpus=1, max_restarts=0)(BuildWorker)
    env = worker_env(options.forward_env)
    actors = [
        actor_class.options(scheduling_strategy="SPREAD", runtime_env={"env_vars": env}).remote(
            config.output, config
        )
        for _ in range(wanted)
    ]
    pool: WorkerPool | None = None
    try:
        actors = _started(ray, actors, options, cpus)
        with translate_errors(ray):
            nodes = ray.get([actor.node_id.remote() for actor in actors])
        pool = WorkerPool(ray, actors, nodes)
        yield pool
    finally:
        if pool is not None:
            pool.settle()
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("killing a worker: %s", exc)


def _started(ray: Any, actors: list[Any], options: RayOptions, cpus: int) -> list[Any]:
    """The actors that came up within the start-up timeout (all of them, normally)."""
    names = {actor.name.remote(): actor for actor in actors}
    deadline = time.monotonic() + options.startup_timeout_s
    ready: list[Any] = []
    pending = list(names)
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
        if done and not ready:
            # Once one worker is up the others get a grace period, not the whole timeout:
            # CPUs of a node just lost may still be counted for a while.
            deadline = min(deadline, time.monotonic() + _GRACE_S)
        ready.extend(done)
    if not ready:
        raise ShardstreamError(
            f"no Ray worker started within {options.startup_timeout_s:.0f} s on the cluster "
            f"at {options.address!r} ({cpus} CPUs): is it busy with other jobs?"
        )
    up = [names[ref] for ref in ready]
    with translate_errors(ray):
        where = ray.get(ready)
    if len(up) < len(actors):
        log.warning(
            "only %d of %d Ray workers started (the cluster has %d CPUs); building with them",
            len(up),
            len(actors),
            cpus,
        )
        kept = {id(actor) for actor in up}
        for actor in actors:
            if id(actor) not in kept:
                ray.kill(actor, no_restart=True)
    log.info("building with %d Ray workers: %s", len(up), ", ".join(sorted(where)))
    return up
