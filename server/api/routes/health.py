"""``/healthz``, ``/readyz`` and ``/metrics`` (no token needed)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shardstream.server.api.deps import authenticate
from shardstream.server.db import describe_failure
from shardstream.server.migrate import schema_problem
from shardstream.wire import ErrorResponse, Health, Scope

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
    responses={
        200: {"content": {"text/plain": {}}, "description": "Prometheus metrics"},
        401: {"model": ErrorResponse, "description": "a token was sent and is not valid"},
    },
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics of this server process; per-run figures (``shardstream_run_*``)
    too when the scrape presents an admin token (``Authorization: Bearer``)."""
    state = request.app.state
    registries = [state.metrics.registry]
    # A token that is sent is checked (a bad one is 401, not silently fewer figures).
    if "authorization" in request.headers and (await authenticate(request)).has(Scope.admin):
        registries.append(state.metrics.run_registry)

    def render() -> bytes:
        return b"".join(generate_latest(registry) for registry in registries)

    return Response(content=await run_in_threadpool(render), media_type=CONTENT_TYPE_LATEST)
