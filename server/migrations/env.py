"""Alembic environment: runs migrations on the connection or URL it is handed."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from shardstream.server.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite needs ALTER via copy
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations() -> None:
    """Migrate the connection in ``config.attributes`` or the ``-x url=...`` database."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give the database with -x url=... ")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_migrations()
