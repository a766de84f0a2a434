"""``shardstream server``: run the metadata server, migrate its database, create tokens.

Only :mod:`argparse` is imported at module level, so ``shardstream --help`` works on a
client-only install; FastAPI, SQLAlchemy and uvicorn are imported by the handlers.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardstream.server.config import Settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``server`` command (and its ``migrate`` / ``create-token`` sub-commands)."""
    server = subparsers.add_parser(
        "server",
        help="run the metadata server",
        description="Run the shardstream metadata server (settings also from SHARDSTREAM_* "
        "environment variables; see docs/server.md).",
    )
    _database_args(server)
    server.add_argument("--host", help="address to listen on (SHARDSTREAM_HOST, 127.0.0.1)")
    server.add_argument("--port", type=int, help="port (SHARDSTREAM_PORT, 8470)")
    server.add_argument(
        "--storage-root", help="default storage root for new versions (SHARDSTREAM_STORAGE_ROOT)"
    )
    server.add_argument("--workers", type=int, help="worker processes (SHARDSTREAM_WORKERS, 1)")
    server.add_argument(
        "--no-migrate", action="store_true", help="do not apply migrations at start"
    )
    server.add_argument(
        "--log-format",
        choices=["auto", "text", "json"],
        help="text lines, or one JSON object per line (SHARDSTREAM_LOG_FORMAT; default auto: "
        "text on a terminal, JSON otherwise)",
    )
    server.set_defaults(handler=_serve)
    commands = server.add_subparsers(dest="server_command", metavar="SUBCOMMAND")

    migrate = commands.add_parser("migrate", help="apply database migrations and exit")
    _database_args(migrate)
    migrate.set_defaults(handler=_migrate)

    token = commands.add_parser(
        "create-token", help="create an API token and print its secret (shown once)"
    )
    _database_args(token)
    token.add_argument("--name", default="admin", help="token name (default: admin)")
    token.add_argument(
        "--scopes", default="admin", help="comma-separated scopes: read, write, admin"
    )
    token.add_argument("--datasets", help="comma-separated dataset allow-list (default: all)")
    token.add_argument("--expires-days", type=float, help="expire after this many days")
    token.set_defaults(handler=_create_token)


def _database_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        help="SQLAlchemy URL (SHARDSTREAM_DATABASE_URL; default sqlite in data dir)",
    )
    parser.add_argument("--data-dir", help="data directory (SHARDSTREAM_DATA_DIR)")


_ENV = {
    "database_url": "SHARDSTREAM_DATABASE_URL",
    "data_dir": "SHARDSTREAM_DATA_DIR",
    "host": "SHARDSTREAM_HOST",
    "port": "SHARDSTREAM_PORT",
    "storage_root": "SHARDSTREAM_STORAGE_ROOT",
    "workers": "SHARDSTREAM_WORKERS",
    "log_format": "SHARDSTREAM_LOG_FORMAT",
}


def _settings_from(args: argparse.Namespace) -> Settings:
    """Command-line values override the environment (and reach uvicorn's workers through it)."""
    import os

    from shardstream.server.config import get_settings

    for attr, env in _ENV.items():
        value = getattr(args, attr, None)
        if value is not None:
            os.environ[env] = str(value)
    if getattr(args, "verbose", False):  # shardstream -v: debug logs, alembic's steps too
        os.environ["SHARDSTREAM_LOG_LEVEL"] = "DEBUG"
    get_settings.cache_clear()
    return _load_settings()


def _load_settings() -> Settings:
    from pydantic import ValidationError

    from shardstream.errors import ConfigError
    from shardstream.server.config import get_settings

    try:
        return get_settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"SHARDSTREAM_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid server settings: {problems}") from exc


def _serve(args: argparse.Namespace) -> int:
    import os

    from shardstream.errors import ConfigError

    try:
        from shardstream.server.config import get_settings
        from shardstream.server.logs import configure_logging

        settings = _settings_from(args)
        settings.check_safe()
        # Before alembic is imported: it logs as it loads its plugins.
        configure_logging(settings.log_level, log_format=settings.resolved_log_format)
        from shardstream.server.data import tokens as tokens_data
        from shardstream.server.db import (
            DatabaseLimits,
            make_engine,
            make_sessionmaker,
            wait_for_database,
        )
        from shardstream.server.migrate import upgrade
        from shardstream.server.serve import bind_socket, serve
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"the server needs the server extra ({exc.name} is missing): "
            "pip install 'shardstream[server]'"
        ) from exc

    # First the port: taken, it is the one error to report, before migrating anything.
    with bind_socket(settings.host, settings.port) as sock:
        engine = make_engine(
            settings.resolved_database_url, limits=DatabaseLimits.from_settings(settings)
        )
        # A database still starting (or down) is a one-line reason and a bounded retry.
        wait_for_database(engine, settings.db_start_timeout_s)
        if not args.no_migrate and settings.migrate_on_start:
            upgrade(engine)
        with make_sessionmaker(engine)() as session:
            settings.check_safe(has_db_tokens=tokens_data.has_admin(session))
        engine.dispose()
        os.environ["SHARDSTREAM_MIGRATE_ON_START"] = "false"  # done once, above
        get_settings.cache_clear()  # the app (in this process too) reads it again
        return 0 if serve(settings, sock) else 1


def _migrate(args: argparse.Namespace) -> int:
    from shardstream.server.db import DatabaseLimits, make_engine, wait_for_database
    from shardstream.server.migrate import upgrade

    settings = _settings_from(args)
    engine = make_engine(
        settings.resolved_database_url, limits=DatabaseLimits.from_settings(settings)
    )
    wait_for_database(engine, settings.db_start_timeout_s)
    before, after = upgrade(engine)
    url = engine.url.render_as_string(hide_password=True)
    print(f"database {url}: {before or 'empty'} -> {after}")
    engine.dispose()
    return 0


def _create_token(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from pydantic import ValidationError

    from shardstream.errors import ConfigError
    from shardstream.server.auth import OPERATOR
    from shardstream.server.data import tokens as tokens_data
    from shardstream.server.db import (
        DatabaseLimits,
        make_engine,
        make_sessionmaker,
        session_scope,
        wait_for_database,
    )
    from shardstream.server.migrate import upgrade
    from shardstream.server.models import utcnow
    from shardstream.wire import TokenCreate

    settings = _settings_from(args)
    try:
        body = TokenCreate(
            name=args.name,
            scopes=[s.strip() for s in args.scopes.split(",") if s.strip()],
            datasets=[d.strip() for d in args.datasets.split(",")] if args.datasets else None,
            expires_at=utcnow() + timedelta(days=args.expires_days) if args.expires_days else None,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"--{where.split('.')[0].replace('_', '-')}: {first['msg']}") from exc
    engine = make_engine(
        settings.resolved_database_url, limits=DatabaseLimits.from_settings(settings)
    )
    wait_for_database(engine, settings.db_start_timeout_s)
    upgrade(engine)
    with session_scope(make_sessionmaker(engine)) as session:
        token = tokens_data.create_from(session, body, minted_by=OPERATOR)
    engine.dispose()
    scopes = ",".join(s.value for s in token.scopes)
    print(f"created token {token.name!r} (id {token.id}, scopes {scopes}); secret, shown once:")
    print(token.secret)
    return 0
