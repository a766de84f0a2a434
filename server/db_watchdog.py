"""Client-side deadlines for PostgreSQL round trips: a silent database costs seconds.

PostgreSQL's own timeouts (``statement_timeout``, ``lock_timeout``) are enforced by the
database server: when that server stops answering altogether (stopped, swapped out, a
network path that drops packets while the kernel still acknowledges), nothing reaches
the client, and libpq waits for a reply forever on a connection already open. New
connections were bounded (``connect_timeout``); a request on a pooled one hung past
90 s, holding a worker thread and a pool slot.

:class:`RoundTripDeadlines` arms a deadline around every round trip the server makes on a
pooled connection, and a single watchdog thread shuts down the socket of a connection
whose round trip outlives it; libpq then fails at once ("server closed the connection"),
SQLAlchemy discards the connection, and the request answers 503. The deadlines:

* the liveness check when a connection is taken from the pool (``SELECT 1``, replacing
  ``pool_pre_ping``): the connect timeout, as for a new connection;
* a statement, a commit, a rollback: the statement timeout plus the connect timeout, so
  the database's own statement timeout (whose error answer is the normal outcome) always
  comes first.

Connections opened with the :data:`UNBOUNDED` execution option (migrations, which may
wait on another replica's migration) are not watched.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect, ExceptionContext
from sqlalchemy.pool import ConnectionPoolEntry

log = logging.getLogger("shardstream.server")

UNBOUNDED = "shardstream_unbounded"
"""Execution option: round trips on this connection have no client-side deadline."""

_FRESH = "shardstream_fresh"


class _Watchdog:
    """One thread for the process: cuts connections whose armed deadline passed."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._armed: dict[int, tuple[float, Any, str]] = {}
        self._thread: threading.Thread | None = None

    def arm(self, dbapi_conn: Any, seconds: float, what: str) -> None:
        with self._changed:
            self._armed[id(dbapi_conn)] = (time.monotonic() + seconds, dbapi_conn, what)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="shardstream-db-watchdog", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def disarm(self, dbapi_conn: Any) -> None:
        with self._changed:
            self._armed.pop(id(dbapi_conn), None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for key, (deadline, conn, what) in list(self._armed.items()):
                    if deadline <= now:
                        del self._armed[key]
                        _cut(conn, what)
                soonest = min((d for d, _, _ in self._armed.values()), default=None)
                self._changed.wait(None if soonest is None else max(soonest - now, 0.01))


_WATCHDOG = _Watchdog()


def _cut(dbapi_conn: Any, what: str) -> None:
    """Shut the connection's socket down: libpq's pending wait ends with an error."""
    try:
        fd = dbapi_conn.fileno()
        sock = socket.socket(fileno=os.dup(fd))  # the same socket; closing the dup is safe
    except Exception:  # closed meanwhile: nothing left to cut
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
    log.warning("database connection cut: %s", what)


class RoundTripDeadlines:
    """Deadlines on an engine's round trips (see the module docstring)."""

    def __init__(self, *, connect_s: float, statement_s: float) -> None:
        self.ping_s = float(connect_s)
        self.statement_s = float(statement_s) + float(connect_s)
        self._dialect: Dialect | None = None

    def install(self, engine: Engine) -> None:
        """Watch ``engine``'s connections (PostgreSQL; created without ``pool_pre_ping``,
        whose check this replaces with one that has a deadline)."""
        self._dialect = engine.dialect
        event.listen(engine, "connect", self._connected)
        event.listen(engine, "checkout", self._ping)
        event.listen(engine, "before_cursor_execute", self._before_execute)
        event.listen(engine, "after_cursor_execute", self._after_execute)
        event.listen(engine, "handle_error", self._on_error)
        event.listen(engine, "commit", self._before_end)
        event.listen(engine, "rollback", self._before_end)
        event.listen(engine, "reset", self._before_reset)
        event.listen(engine, "checkin", self._checked_in)

    def _statement(self) -> str:
        return (
            f"no answer within {self.statement_s:g} s (the statement timeout plus the "
            "connect timeout): the database server went silent"
        )

    def _connected(self, _dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info[_FRESH] = True  # just connected: its first checkout needs no check

    def _ping(self, dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        if record.info.pop(_FRESH, False):
            return
        what = f"no answer to a liveness check within {self.ping_s:g} s (the connect timeout)"
        _WATCHDOG.arm(dbapi_conn, self.ping_s, what)
        try:
            assert self._dialect is not None  # set by install()
            self._dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards this connection and opens a new one (bounded by the
            # connect timeout) instead of handing out a dead one.
            raise sa_exc.DisconnectionError(f"liveness check failed: {exc}") from exc
        finally:
            _WATCHDOG.disarm(dbapi_conn)

    def _before_execute(self, conn: Connection, *_args: Any) -> None:
        if not conn.get_execution_options().get(UNBOUNDED, False):
            dbapi_conn = _dbapi(conn)
            if dbapi_conn is not None:
                _WATCHDOG.arm(dbapi_conn, self.statement_s, self._statement())

    def _after_execute(self, conn: Connection, *_args: Any) -> None:
        dbapi_conn = _dbapi(conn)
        if dbapi_conn is not None:
            _WATCHDOG.disarm(dbapi_conn)

    def _on_error(self, context: ExceptionContext) -> None:
        if context.connection is not None:
            self._after_execute(context.connection)

    def _before_end(self, conn: Connection) -> None:
        # COMMIT or ROLLBACK: disarmed when the connection returns to the pool (the
        # next statement re-arms it, should the session go on).
        self._before_execute(conn)

    def _before_reset(
        self, dbapi_connection: Any, connection_record: Any, reset_state: Any
    ) -> None:
        # The pool's own rollback when a connection is returned (SQLAlchemy tells the
        # listener's signature by its parameter names: keep them).
        _WATCHDOG.arm(dbapi_connection, self.statement_s, self._statement())

    def _checked_in(self, dbapi_conn: Any, _record: Any) -> None:
        if dbapi_conn is not None:
            _WATCHDOG.disarm(dbapi_conn)


def _dbapi(conn: Connection) -> Any | None:
    """The driver connection under ``conn``; None once it was invalidated (a connection
    cut by the watchdog is: its transaction must be rolled back before anything else)."""
    if conn.invalidated or conn.closed:
        return None
    try:
        return conn.connection.dbapi_connection
    except sa_exc.SQLAlchemyError:
        return None
