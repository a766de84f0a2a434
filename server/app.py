"""The FastAPI application factory.

``create_app(settings)`` builds everything from the settings it is given (the engine,
migrations, stores, metrics); nothing happens at import time. ``uvicorn --factory
shardstream.server.app:create_app`` reads the settings from the environment.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from shardstream import __version__
from shardstream.server import handlers, migrate
from shardstream.server.api.deps import authenticate
from shardstream.server.api.routes import datasets, health, runs, shards, tokens, versions
from shardstream.server.auth import TokenCache
from shardstream.server.budget import TokenAccounts, TokenBudget, TokenBudgetGuard
from shardstream.server.cache.published import PublishedCache
from shardstream.server.cache.singleflight import SingleFlight
from shardstream.server.config import Settings, get_settings
from shardstream.server.console import pages as console
from shardstream.server.console.headers import ConsoleHeaders
from shardstream.server.data import datasets as datasets_data
from shardstream.server.data import input_stats as input_stats_data
from shardstream.server.data import runs as runs_data
from shardstream.server.data import versions as versions_data
from shardstream.server.db import (
    WRITE_OPTION,
    DatabaseLimits,
    make_engine,
    make_sessionmaker,
    wait_for_database,
)
from shardstream.server.health_gate import HealthGate
from shardstream.server.limits import BodyLimits, RequestGuard
from shardstream.server.logs import configure_logging
from shardstream.server.metrics import RUN_METRICS_LIMIT, MetricsMiddleware, ServerMetrics
from shardstream.server.priority import WritePriority
from shardstream.server.storage.stores import StoreCache
from shardstream.wire import FieldLimits, set_field_limits

log = logging.getLogger("shardstream.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; ``settings`` defaults to :func:`get_settings` (the environment),
    in which case the process's logging is configured too (see :mod:`.logs`)."""
    if settings is None:
        # The server process (uvicorn factory): configure logging for the process. Apps
        # built with explicit settings (tests, embedding) leave global logging alone.
        settings = get_settings()
        configure_logging(settings.log_level, log_format=settings.resolved_log_format)
    engine = make_engine(
        settings.resolved_database_url,
        pool_size=settings.db_pool_size,
        limits=DatabaseLimits.from_settings(settings),
    )
    if settings.migrate_on_start:
        wait_for_database(engine, settings.db_start_timeout_s)
        migrate.upgrade(engine)
    factory = make_sessionmaker(engine)
    # Free-form JSON fields are checked while the request is validated (shardstream.wire).
    set_field_limits(FieldLimits(settings.max_json_bytes, settings.max_json_depth))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Storage (boto3) is imported lazily by the stores; load it now so the first
        # publish or presign of a starting job does not pay ~0.1 s of imports.
        await run_in_threadpool(importlib.import_module, "shardstream.storage")
        # `shardstream server` bound and listens on the socket before the app starts
        # (server/serve.py), so this line comes only once requests will be answered.
        log.info(
            "server ready", extra={"database": engine.url.render_as_string(hide_password=True)}
        )
        yield
        engine.dispose()

    app = FastAPI(
        title="shardstream",
        version=__version__,
        description="Metadata service: datasets, immutable versions, shard index, runs, "
        "checkpoints, tokens, presigned shard URLs.",
        lifespan=lifespan,
    )

    app.state.token_cache = TokenCache(settings.token_cache_s)
    app.state.token_lookups = SingleFlight()
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = factory
    reads = (
        engine.execution_options(isolation_level="AUTOCOMMIT")
        if engine.dialect.name == "postgresql"
        else engine
    )
    app.state.read_sessions = make_sessionmaker(reads)
    app.state.write_sessions = make_sessionmaker(engine.execution_options(**{WRITE_OPTION: True}))
    app.state.stores = StoreCache(public_endpoint_url=settings.s3_public_endpoint_url)
    app.state.published = PublishedCache(settings.version_cache_s)
    # SQLite has one writer at a time: write sessions queue here (see deps.get_db).
    app.state.write_gate = asyncio.Lock() if settings.is_sqlite else None
    metrics = ServerMetrics()

    def entity_counts() -> dict[str, dict[str, int]]:
        with factory() as session:
            return {
                "datasets": {"all": datasets_data.count(session)},
                "versions": versions_data.count_by_status(session),
                "runs": runs_data.count_by_status(session),
            }

    metrics.add_entity_collector(entity_counts)

    def run_inputs() -> list[input_stats_data.RunAggregate]:
        with factory() as session:
            return input_stats_data.running_aggregates(session, RUN_METRICS_LIMIT)

    metrics.add_run_input_collector(run_inputs)
    app.state.metrics = metrics
    handlers.install(app)
    for module in (datasets, versions, shards, runs, tokens):
        app.include_router(module.router)
    app.include_router(health.router)
    if settings.console:
        console.install(app)
    limits = BodyLimits(
        max_bytes=settings.max_body_bytes,
        max_shard_batch_bytes=settings.max_shard_batch_bytes,
        timeout_s=settings.body_timeout_s,
    )
    # Inside the guard: only an authenticated commit whose body has arrived holds reads.
    app.add_middleware(WritePriority, read_slots=settings.read_slots)
    app.add_middleware(RequestGuard, limits=limits, authenticate=authenticate)
    # Outside the guard: a caller over its budget is refused before its body is read.
    accounts = TokenAccounts(
        TokenBudget(
            concurrency=settings.token_concurrency,
            busy_s=settings.token_busy_s,
            burst_s=settings.token_burst_s,
        )
    )
    app.state.token_accounts = accounts  # the sign-in route charges the token too
    app.add_middleware(TokenBudgetGuard, accounts=accounts, authenticate=authenticate)
    app.add_middleware(HealthGate, engine=engine)  # probes wait in no queue
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    if settings.console:
        app.add_middleware(ConsoleHeaders)  # outermost: the guard's answers under /ui too
    return app
