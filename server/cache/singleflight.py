"""Single flight: concurrent callers asking for the same thing share one load."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class SingleFlight(Generic[K, T]):
    """Run ``load`` once per key at a time; concurrent callers share its result.

    The load runs as its own task, so a caller that goes away (a client disconnecting)
    cancels only its own wait, never the load the others are waiting for.
    """

    def __init__(self) -> None:
        self._pending: dict[K, asyncio.Future[T]] = {}

    async def run(self, key: K, load: Callable[[], Awaitable[T]]) -> T:
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(load())
            self._pending[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    def _done(self, key: K, task: asyncio.Future[T]) -> None:
        del self._pending[key]
        if not task.cancelled():
            task.exception()  # retrieved: no warning when every waiter went away
