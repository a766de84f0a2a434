"""``/healthz`` and ``/readyz`` answered ahead of every queue in the server.

Kubernetes restarts a pod whose liveness probe goes unanswered, and takes it out of its
Service when readiness does. Behind the per-token budget, the body guard, write priority,
FastAPI's routing and the shared thread pool, a probe waited like any read: under a
64-connection start-up load both went unanswered for over 1 s, past Kubernetes' default
1 s probe timeout, so a busy but healthy server looked dead. :class:`HealthGate` (pure
ASGI, just inside the request metrics) answers them itself:

* ``/healthz`` at once: the process's event loop answers, which is all liveness means;
* ``/readyz`` by asking the database (connect, read the migration revision) on a thread
  of its own (never queued behind the request thread pool), within
  :data:`READY_DEADLINE_S` (503 past it, naming it); probes arriving together share one
  check, so a burst of probes costs one query.

The routes in :mod:`.api.routes.health` stay as the documented API (OpenAPI) and for apps
mounted without this gate.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from starlette.types import ASGIApp, Receive, Scope, Send

from shardstream.server.cache.singleflight import SingleFlight
from shardstream.server.db import describe_failure
from shardstream.server.migrate import schema_problem
from shardstream.wire import Health

READY_DEADLINE_S = 2.0
"""How long ``/readyz`` waits for the database before it answers 503."""


@dataclass(frozen=True)
class _Route:
    """What the request metrics label a gate's answer with (the route template)."""

    path: str


class HealthGate:
    """Answer ``GET``/``HEAD`` ``/healthz`` and ``/readyz`` before anything else runs."""

    def __init__(self, app: ASGIApp, *, engine: Engine) -> None:
        self.app = app
        self.engine = engine
        self._checks: SingleFlight[str, str | None] = SingleFlight()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readyz")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if (
            scope["type"] != "http"
            or path not in ("/healthz", "/readyz")
            or scope.get("method") not in ("GET", "HEAD")
        ):
            await self.app(scope, receive, send)
            return
        scope["route"] = _Route(str(path))
        problem = None if path == "/healthz" else await self._checks.run("ready", self._ready)
        health = (
            Health(status="ok") if problem is None else Health(status="unavailable", detail=problem)
        )
        body = health.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200 if problem is None else 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _ready(self) -> str | None:
        loop = asyncio.get_running_loop()
        check = loop.run_in_executor(self._thread, self._schema_problem)
        try:
            return await asyncio.wait_for(asyncio.shield(check), READY_DEADLINE_S)
        except TimeoutError:
            # The thread finishes its check in the background (the database's own
            # connect and statement timeouts bound it); later probes queue behind it.
            return f"the database did not answer within {READY_DEADLINE_S:g} s"

    def _schema_problem(self) -> str | None:
        try:
            with self.engine.connect() as conn:
                return schema_problem(conn)
        except Exception as exc:  # any failure means "not ready"; report it, never raise
            return describe_failure(exc)
