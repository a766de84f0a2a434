"""What a use case needs of the running server, as one explicit value.

The app keeps these on ``app.state``; a use case takes them as arguments instead, so it
runs the same under a route, in a test or from a script (no request in sight).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from shardstream.server.cache.published import PublishedCache
from shardstream.server.config import Settings
from shardstream.server.metrics import ServerMetrics
from shardstream.server.storage.stores import StoreCache


@dataclass(frozen=True)
class ServerParts:
    """The shared parts of one server process that use cases read and write through."""

    settings: Settings
    read_sessions: sessionmaker[Session]
    """Sessions for reads (autocommit on PostgreSQL)."""
    write_sessions: sessionmaker[Session]
    """Sessions for writes (``BEGIN IMMEDIATE`` on SQLite)."""
    stores: StoreCache
    published: PublishedCache
    metrics: ServerMetrics
    write_gate: asyncio.Lock | None
    """SQLite's one-writer queue (None on PostgreSQL)."""

    @classmethod
    def of(cls, state: Any) -> ServerParts:
        """The parts an app built by :func:`~shardstream.server.app.create_app` keeps on
        ``app.state`` (gathered on first use and kept there: the hot routes ask on every
        request)."""
        parts: ServerParts | None = getattr(state, "server_parts", None)
        if parts is None:
            parts = cls(
                settings=state.settings,
                read_sessions=state.read_sessions,
                write_sessions=state.write_sessions,
                stores=state.stores,
                published=state.published,
                metrics=state.metrics,
                write_gate=getattr(state, "write_gate", None),
            )
            state.server_parts = parts
        return parts

    def write_turn(self) -> AbstractAsyncContextManager[Any]:
        """Wait for this process's turn to write (SQLite has one writer at a time)."""
        return self.write_gate if self.write_gate is not None else nullcontext()
