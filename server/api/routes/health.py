"""``/healthz``, ``/readyz`` and ``/metrics`` (no token needed)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shardstream.server.db import describe_failure
from shardstream.server.migrate import schema_problem
from shardstream.wire import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@router.get(
    "/readyz",
    responses={503: {"model": Health, "description": "database unusable (the detail says why)"}},
)
def readyz(request: Request, response: Response) -> Health:
    """Readiness: the database answers and is migrated as far as this server needs."""
    try:
        with request.app.state.engine.connect() as conn:
            problem = schema_problem(conn)
    except Exception as exc:  # any failure means "not ready"; report it, never raise
        problem = describe_failure(exc)
    if problem is not None:
        response.status_code = 503
        return Health(status="unavailable", detail=problem)
    return Health(status="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus metrics"}},
)
def metrics(request: Request) -> Response:
    """Prometheus metrics of this server process."""
    body = generate_latest(request.app.state.metrics.registry)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
