"""Apply the packaged alembic migrations to a database.

Used by ``shardstream server migrate`` and at server start (``SHARDSTREAM_MIGRATE_ON_START``).
On PostgreSQL an advisory lock serializes concurrent migrators, so several replicas or
workers starting at once never race each other.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from shardstream.server.db_watchdog import UNBOUNDED

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_LOCK_ID = 0x5348_4152_4453  # arbitrary, constant: "SHARDS"

log = logging.getLogger("shardstream.server")


def alembic_config() -> Config:
    """The alembic configuration pointing at the packaged migration scripts."""
    cfg = Config(str(_MIGRATIONS / "alembic.ini"))
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("version_locations", str(_MIGRATIONS / "versions"))
    return cfg


def head_revision() -> str | None:
    """The newest migration revision shipped with this package."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@cache
def _shipped() -> tuple[str | None, frozenset[str]]:
    scripts = ScriptDirectory.from_config(alembic_config())
    return scripts.get_current_head(), frozenset(s.revision for s in scripts.walk_revisions())


def schema_problem(conn: Connection) -> str | None:
    """Why this server cannot work with the database's schema (None: it can).

    Raises the database's error when there is no migration table at all. A revision this
    package does not know is a newer release's: migrations only add, so it is usable.
    """
    stamped = set(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())
    head, known = _shipped()
    if head in stamped or (stamped and not stamped & known):
        return None
    found = ", ".join(sorted(stamped)) or "none"
    return (
        f"the database schema is at revision {found}, this server needs {head}: run "
        "'shardstream server migrate' (or start the server with migrations on)"
    )


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database behind ``engine`` to ``revision``; returns the revisions
    before and after (read under the migration lock; ``None``: never migrated)."""
    cfg = alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # A migration may rewrite large tables and wait for another replica's
            # migration: the request-sized statement and lock timeouts do not apply,
            # nor do the client-side deadlines that stand in for them (db_watchdog).
            conn.execution_options(**{UNBOUNDED: True})
            conn.execute(text("SET LOCAL statement_timeout = 0"))
            conn.execute(text("SET LOCAL lock_timeout = 0"))
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        before = MigrationContext.configure(conn).get_current_revision()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        after = MigrationContext.configure(conn).get_current_revision()
    # One line for the whole upgrade; alembic's own, one per step, are debug detail.
    if before == after:
        log.info("database schema at revision %s", after)
    else:
        log.info("database schema migrated from revision %s to %s", before or "none", after)
    return before, after
