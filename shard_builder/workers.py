"""Running work items on every core, with results delivered in input order.

The builder's determinism rests on this: items go out to worker processes in any order,
but :func:`ordered_map` hands their results back strictly in input order, so everything
downstream (sequence cutting, shard boundaries) is independent of scheduling and of the
worker count. At most ``window`` results wait in memory at once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from shardstream.errors import ShardstreamError

T = TypeVar("T")
R = TypeVar("R")


def _init_worker() -> None:
    # Each worker is one process per core already; HF tokenizers' own thread pool on top
    # would only oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], *, workers: int, window: int | None = None
) -> Iterator[R]:
    """``map(fn, items)`` over ``workers`` processes, results in order.

    ``fn`` must be a module-level function (it is pickled). With ``workers == 1`` it runs
    in this process, which gives the same results. An exception raised by ``fn`` is
    re-raised here for the item it failed on, after cancelling the items not started.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    window = window or 2 * workers
    # fork (where available): workers start in milliseconds and, unlike spawn/forkserver,
    # do not re-run the caller's __main__ (a script without a main guard still works).
    # The pool starts all its workers at the first submit, before the builder starts its
    # upload thread, so no builder thread is copied mid-operation.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    pending: deque[Future[R]] = deque()
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker)
    processes: dict[int, Any] = {}  # every worker process, kept to read how one died
    finished = False
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            processes.update(getattr(pool, "_processes", None) or {})
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
        finished = True
    except BrokenProcessPool as exc:
        raise ShardstreamError(
            f"a builder worker process died ({_cause(processes.values())}); "
            "the finished shards are kept - run the same command again to resume"
        ) from exc
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:
            _abandon(pool)


def _cause(processes: Iterable[Any]) -> str:
    """Why a worker died, from the signal that ended it (the pool stops the others with
    SIGTERM afterwards: those are not the cause)."""
    signals = set()
    for process in processes:
        process.join(timeout=1)
        if process.exitcode is not None and process.exitcode < 0:
            signals.add(-process.exitcode)
    if signal.SIGBUS in signals:
        return (
            "SIGBUS: a file it read through a memory map ended early or is damaged, such as "
            "an LMDB database that is cut short or garbled, or an input changed while it "
            "was read; check the input"
        )
    if signal.SIGSEGV in signals:
        return "SIGSEGV: a library crashed on its input; check the input"
    return "killed, or out of memory: try fewer --workers"


def _abandon(pool: ProcessPoolExecutor) -> None:
    """Stop a pool whose results are no longer wanted, without waiting for its work.

    Waiting in ``shutdown`` for the items still running can hang on some Python 3.11
    releases (seen on 3.11.2 after a worker raised); the work is discarded anyway.
    """
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
