"""Database engine and sessions (SQLAlchemy 2, synchronous).

The engine is created by the app factory from the settings, never at import time. SQLite
gets WAL mode and a busy timeout so readers never block the one writer for long;
PostgreSQL gets a connection pool sized by ``SHARDSTREAM_DB_POOL_SIZE`` and a liveness
check on checkout (a connection the database server dropped is replaced, not used), with
client-side deadlines on every round trip (:mod:`.db_watchdog`).

Every wait on the database is bounded (:class:`DatabaseLimits`): connecting, a
statement, a lock, a free pooled connection. A database that accepts connections but
never answers therefore costs a request a few seconds and a 503, never a hung worker.

An SQLite file deleted or replaced under a running server is noticed too (see
:class:`_SQLiteFile`), and :func:`describe_failure` turns any database failure into the
message a 503 answer carries.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from shardstream.errors import ConfigError, ShardstreamError
from shardstream.server.db_watchdog import RoundTripDeadlines

if TYPE_CHECKING:
    from shardstream.server.config import Settings

WRITE_OPTION = "shardstream_write"

log = logging.getLogger("shardstream.server")


class DatabaseUnavailableError(ShardstreamError):
    """The database could not be reached at start-up within ``SHARDSTREAM_DB_START_TIMEOUT_S``."""


@dataclass(frozen=True)
class DatabaseLimits:
    """How long anything may wait on the database (``SHARDSTREAM_DB_*`` settings).

    ``lock_s`` is PostgreSQL's ``lock_timeout`` and SQLite's busy timeout; ``statement_s``
    applies on PostgreSQL only (SQLite runs in-process: nothing to wait for but locks).
    """

    connect_s: int = 5
    statement_s: float = 30.0
    lock_s: float = 10.0
    pool_s: float = 10.0

    @classmethod
    def from_settings(cls, settings: Settings) -> DatabaseLimits:
        """The limits a server with ``settings`` runs with."""
        return cls(
            connect_s=settings.db_connect_timeout_s,
            statement_s=settings.db_statement_timeout_s,
            lock_s=settings.db_lock_timeout_s,
            pool_s=settings.db_pool_timeout_s,
        )

    def postgres_options(self) -> str:
        """libpq ``options``: server-side timeouts set once per connection (no round trip).

        A session left idle inside a transaction is ended by the server too, so a
        connection leaked by a bug cannot hold locks or a pool slot forever.
        """
        idle_ms = int(max(self.statement_s * 2, 60) * 1000)
        return (
            f"-c statement_timeout={int(self.statement_s * 1000)} "
            f"-c lock_timeout={int(self.lock_s * 1000)} "
            f"-c idle_in_transaction_session_timeout={idle_ms}"
        )


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, *, busy_ms: int = 10_000) -> None:
    # Take transaction control away from the driver so _sqlite_begin decides how to BEGIN.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    # A deferred transaction that reads and then writes fails with SQLITE_BUSY (without
    # waiting) when another writer committed meanwhile; write requests therefore take the
    # write lock up front, and concurrent writers queue on busy_timeout instead of failing.
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


class _SQLiteFile:
    """Connections to one SQLite file that exists, and stays the file they opened.

    A connection keeps the file it opened even after that file is deleted or replaced,
    and SQLite in WAL mode goes on reading *and committing* there: without this guard, a
    server whose file was deleted under it kept acknowledging writes into a file that no
    longer has a name (gone at the next restart), while new connections silently created
    an empty database in its place. So connections open the file with ``mode=rw`` (never
    create it; :func:`make_engine` does that once) and remember which file they opened;
    a pooled connection whose file is no longer at the path is replaced on checkout, and
    when nothing can be opened there the request fails with a database error (a 503).
    """

    def __init__(self, path: Path, busy_s: float = 10.0) -> None:
        self.path = path.expanduser().absolute()
        self._uri = self.path.as_uri() + "?mode=rw"
        self._busy_s = busy_s

    def create(self) -> None:
        """Create an empty database file (and its directory) if there is none yet."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            sqlite3.connect(self.path).close()

    def connect(self) -> sqlite3.Connection:
        """The engine's ``creator``: open the existing file, read-write."""
        return sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=self._busy_s)

    def _identity(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_dev, stat.st_ino

    def _vanished(self) -> str:
        return f"the SQLite database file {self.path} was deleted or replaced while open"

    def on_connect(self, _dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info["sqlite_file"] = self._identity()

    def on_checkout(self, _dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        if self._identity() == record.info.get("sqlite_file"):
            record.info["sqlite_checked"] = True
            return
        message = self._vanished()
        if record.info.get("sqlite_checked"):
            # A pooled connection to the old file: the pool reconnects (once) to the path.
            raise sa_exc.DisconnectionError(message)
        # A connection opened just now, and the file changed already: give up (a 503)
        # rather than let the pool retry until it runs out of attempts.
        raise sqlite3.OperationalError(message)

    def on_commit(self, conn: Connection) -> None:
        # The file vanished during this transaction: roll it back rather than commit there.
        if self._identity() != conn.connection.info.get("sqlite_file"):
            raise sa_exc.OperationalError(
                "COMMIT", None, sqlite3.OperationalError(self._vanished())
            )


def make_engine(url: str, *, pool_size: int = 10, limits: DatabaseLimits | None = None) -> Engine:
    """Create an engine for ``url``; creates the SQLite file (and its directory) if needed."""
    limits = limits or DatabaseLimits()
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"SHARDSTREAM_DATABASE_URL={url!r} is not a database URL; use "
            "sqlite:////abs/path.db or postgresql+psycopg://user@host/db"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        file = None
        options: dict[str, Any] = {
            "connect_args": {"check_same_thread": False, "timeout": limits.lock_s}
        }
        if parsed.database and parsed.database != ":memory:":
            if parsed.query:  # SQLite URI options (mode=ro, ...): open as the URL says
                Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            else:
                file = _SQLiteFile(Path(parsed.database), limits.lock_s)
                file.create()
                options = {"creator": file.connect}
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            pool_timeout=limits.pool_s,
            **options,
        )
        busy_ms = int(limits.lock_s * 1000)

        def pragmas(dbapi_conn: Any, record: Any) -> None:
            _sqlite_pragmas(dbapi_conn, record, busy_ms=busy_ms)

        event.listen(engine, "connect", pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        if file is not None:
            event.listen(engine, "connect", file.on_connect)
            event.listen(engine, "checkout", file.on_checkout)
            event.listen(engine, "commit", file.on_commit)
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            # psycopg 3 is the driver we ship; plain postgresql:// would mean psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg")
        engine = create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            pool_recycle=1800,
            pool_timeout=limits.pool_s,
            connect_args={
                "connect_timeout": limits.connect_s,
                "options": limits.postgres_options(),
            },
        )
        # Every round trip on an open connection gets a client-side deadline too (the
        # liveness check on checkout included): a database that goes silent without
        # closing anything costs a request seconds and a 503, never a hung thread.
        RoundTripDeadlines(connect_s=limits.connect_s, statement_s=limits.statement_s).install(
            engine
        )
        return engine
    raise ConfigError(
        f"SHARDSTREAM_DATABASE_URL uses {parsed.get_backend_name()!r}; supported: sqlite, "
        "postgresql (postgresql+psycopg://)"
    )


# What a database failure means, by words in the driver's message (SQLite, psycopg), first
# match wins. Messages name the problem and the fix, but neither the file path nor the
# database host: /readyz answers without a token (the server log has the details).
_FAILURES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("unable to open database file", "deleted or replaced while open"),
        "the SQLite database file (SHARDSTREAM_DATABASE_URL) cannot be opened: it was "
        "deleted, moved or made unreadable while the server ran; put it back (or run "
        "'shardstream server migrate' for a new, empty one)",
    ),
    (
        ("file is not a database", "malformed"),
        "the SQLite database file (SHARDSTREAM_DATABASE_URL) is damaged or not a database; "
        "restore it from a backup",
    ),
    (
        ("connection refused", "could not connect", "connection failed", "could not translate"),
        "cannot connect to the database server; retry shortly",
    ),
    (
        ("timeout expired", "timed out"),
        "the database server did not answer in time (SHARDSTREAM_DB_CONNECT_TIMEOUT_S); "
        "retry shortly",
    ),
    (
        ("statement timeout", "lock timeout"),
        "the database took too long (SHARDSTREAM_DB_STATEMENT_TIMEOUT_S or "
        "SHARDSTREAM_DB_LOCK_TIMEOUT_S); retry",
    ),
    (
        ("server closed the connection", "terminating connection", "connection is closed"),
        "the connection to the database server was lost; retry",
    ),
    (
        ("no such table", "no such column", "does not exist"),
        "the database lacks tables or columns this server needs (it was replaced by an "
        "empty database, or not migrated to this server's version); run 'shardstream server "
        "migrate' or restore the database",
    ),
    (
        ("readonly", "read-only"),
        "the database is read-only (file permissions or a read-only disk); make the SQLite "
        "file and its directory writable by the server",
    ),
    (
        ("database or disk is full", "disk i/o error", "no space left"),
        "the database's disk is full or failing; free space or check the disk, then retry",
    ),
    (
        ("database is locked", "database table is locked"),
        "the database is busy (another process holds its write lock); retry shortly",
    ),
)


def describe_failure(exc: BaseException) -> str:
    """What a database failure means for a client: the message of a 503 answer.

    >>> describe_failure(sa_exc.OperationalError("SELECT 1", {}, Exception("Connection refused")))
    'database unavailable: cannot connect to the database server; retry shortly'
    """
    if isinstance(exc, sa_exc.TimeoutError):
        return "database unavailable: every database connection is in use; retry shortly"
    cause = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    text = str(cause).lower()
    for words, meaning in _FAILURES:
        if any(word in text for word in words):
            return f"database unavailable: {meaning}"
    return "database unavailable: the database failed to answer; retry shortly"


def wait_for_database(engine: Engine, timeout_s: float) -> None:
    """Return once the database accepts a connection; retry for up to ``timeout_s``.

    A server starting next to its database (same deployment, a restart) usually comes up
    first: one warning line per attempt instead of a traceback, then
    :class:`DatabaseUnavailableError` (one line) when the time is up.
    """
    if engine.dialect.name == "sqlite":
        timeout_s = 0  # a local file that cannot be opened now will not open by waiting
    deadline = time.monotonic() + timeout_s
    delay = 0.5
    while True:
        try:
            with engine.connect():
                return
        except (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError) as exc:
            reason = describe_failure(exc)
            left = deadline - time.monotonic()
            url = engine.url.render_as_string(hide_password=True)
            if left <= 0:
                raise DatabaseUnavailableError(
                    f"{reason.removesuffix('; retry shortly')} ({url}); gave up after "
                    f"{timeout_s:g} s (SHARDSTREAM_DB_START_TIMEOUT_S)"
                ) from None
            log.warning(f"waiting for the database ({url}): {reason}; {left:.0f} s left")
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory; objects stay readable after commit (responses serialize them)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
