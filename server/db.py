"""Database engine and sessions (SQLAlchemy 2, synchronous).

The engine is created by the app factory from the settings, never at import time. SQLite
gets WAL mode and a busy timeout so readers never block the one writer for long;
PostgreSQL gets a connection pool sized by ``SHARDSTREAM_DB_POOL_SIZE``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from shardstream.errors import ConfigError

WRITE_OPTION = "shardstream_write"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # Take transaction control away from the driver so _sqlite_begin decides how to BEGIN.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    # A deferred transaction that reads and then writes fails with SQLITE_BUSY (without
    # waiting) when another writer committed meanwhile; write requests therefore take the
    # write lock up front, and concurrent writers queue on busy_timeout instead of failing.
    write = conn.get_execution_options().get(WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    """Create an engine for ``url``; creates the SQLite file's directory if needed."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"SHARDSTREAM_DATABASE_URL={url!r} is not a database URL; use "
            "sqlite:////abs/path.db or postgresql+psycopg://user@host/db"
        ) from exc
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=pool_size,
            max_overflow=2 * pool_size,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            # psycopg 3 is the driver we ship; plain postgresql:// would mean psycopg2.
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=2 * pool_size,
            pool_pre_ping=True,
            pool_recycle=1800,
        )
    raise ConfigError(
        f"SHARDSTREAM_DATABASE_URL uses {parsed.get_backend_name()!r}; supported: sqlite, "
        "postgresql (postgresql+psycopg://)"
    )


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
