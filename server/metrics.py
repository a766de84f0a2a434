"""Prometheus metrics with a registry per app (several apps can live in one process).

Request counts and latency are labelled by route *template* (``/v1/datasets/{name}``),
never by raw path, so label cardinality stays bounded. Entity gauges are read from the
database at scrape time, so every replica reports the same totals.

Per-run figures (:attr:`ServerMetrics.run_registry`) are exported only to a scrape that
presents an admin token: ``/metrics`` needs no token, and its runs' figures name every
running run of every dataset. They cost one stored row per run, whatever its ranks
(:mod:`~shardstream.server.data.run_input_totals`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("shardstream.server.access")
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    """The metrics of one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "shardstream_http_requests",
            "HTTP requests by method, route template and status",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "shardstream_http_request_duration_seconds",
            "HTTP request latency by method and route template",
            ["method", "route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.checkpoint_commits = Counter(
            "shardstream_checkpoint_commits",
            "checkpoint commits by result (created, unchanged, conflict)",
            ["result"],
            registry=self.registry,
        )
        self.publishes = Counter(
            "shardstream_version_publishes", "versions published", registry=self.registry
        )
        self.run_registry = CollectorRegistry(auto_describe=True)
        """The per-run figures: for admin scrapes only (see the module's docstring)."""

    def add_entity_collector(self, counts: Callable[[], dict[str, dict[str, int]]]) -> None:
        """Register gauges fed by ``counts()`` -> {entity: {status: n}} at scrape time."""
        self.registry.register(_EntityCollector(counts))

    def add_run_input_collector(self, runs: Callable[[], list[Any]]) -> None:
        """Register the per-run input figures, read by ``runs()`` at scrape time (a list of
        :class:`~shardstream.server.data.input_stats.RunAggregate`), in
        :attr:`run_registry`."""
        self.run_registry.register(_RunInputCollector(runs))


class _EntityCollector:
    def __init__(self, counts: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self._counts()
        except Exception:  # a scrape must not fail because the database blinked
            return
        for entity, by_status in counts.items():
            gauge = GaugeMetricFamily(
                f"shardstream_{entity}", f"number of {entity} by status", labels=["status"]
            )
            for status, n in sorted(by_status.items()):
                gauge.add_metric([status], n)
            yield gauge

    def describe(self) -> list[Metric]:
        return []


CLIENT_DISCONNECT = "client_disconnect"
"""The ``status`` label of a request its client abandoned before any answer started: no
server error (so ``status=~"5.."`` alerts mean the server failed) and no client error."""

UNMATCHED = "<unmatched>"


RUN_METRICS_LIMIT = 100
"""Running runs exported by ``/metrics`` at most (the most recently updated): series are
labelled by run, never by rank, so a scrape stays bounded however large the jobs."""

# (metric suffix, RunAggregate field, help) of the per-run counters.
_RUN_COUNTERS = (
    ("data_wait_seconds", "data_wait_s", "time the ranks' training loops waited for data"),
    ("step_seconds", "step_s", "time the ranks' training loops spent between batches"),
    ("storage_bytes", "storage_bytes", "bytes the ranks read from storage"),
    ("storage_requests", "storage_requests", "requests the ranks sent to storage"),
    ("storage_throttled", "throttled", "storage answers asking to slow down (503, 429)"),
    ("storage_retries", "retries", "storage requests retried"),
    ("cache_hits", "cache_hits", "node cache hits"),
    ("cache_misses", "cache_misses", "node cache misses"),
)


class _RunInputCollector:
    """Input figures of running runs, summed over their ranks as they commit, from the
    database."""

    def __init__(self, runs: Callable[[], list[Any]]) -> None:
        self._runs = runs

    def collect(self) -> Iterator[Metric]:
        try:
            runs = self._runs()
        except Exception:  # a scrape must not fail because the database blinked
            return
        for suffix, field, text in _RUN_COUNTERS:
            counter = CounterMetricFamily(f"shardstream_run_{suffix}", text, labels=["run"])
            for run in runs:
                counter.add_metric([str(run.run_id)], getattr(run, field))
            yield counter
        ratio = GaugeMetricFamily(
            "shardstream_run_data_wait_ratio",
            "data wait over data wait plus step, over the run's ranks",
            labels=["run"],
        )
        reporting = GaugeMetricFamily(
            "shardstream_run_ranks_reporting", "ranks that sent input figures", labels=["run"]
        )
        expected = GaugeMetricFamily(
            "shardstream_run_ranks", "the run's world size, as its ranks report it", labels=["run"]
        )
        bound = GaugeMetricFamily(
            "shardstream_run_ranks_input_bound",
            "ranks whose latest figures say input-bound",
            labels=["run"],
        )
        verdict = GaugeMetricFamily(
            "shardstream_run_input_verdict",
            "1 for the run's verdict (not_input_bound, io_bound, cpu_bound, unknown)",
            labels=["run", "verdict"],
        )
        for run in runs:
            label = str(run.run_id)
            total = run.data_wait_s + run.step_s
            ratio.add_metric([label], run.data_wait_s / total if total > 0 else 0.0)
            reporting.add_metric([label], run.ranks)
            expected.add_metric([label], run.world_size)
            bound.add_metric([label], run.input_bound_ranks)
            verdict.add_metric([label, run.verdict], 1)
        yield from (ratio, reporting, expected, bound, verdict)

    def describe(self) -> list[Metric]:
        return []


class MetricsMiddleware:
    """Pure ASGI middleware timing every HTTP request (cheaper than BaseHTTPMiddleware).

    A request whose client hung up before an answer started (half a body sent, a commit
    cancelled by a killed job) is counted with status :data:`CLIENT_DISCONNECT` (on route
    ``<unmatched>`` where the body guard stopped it before routing). A request the app
    left unanswered for any other reason, or that raised, stays a 500: a server error.
    """

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None
        disconnected = False

        async def receive_wrapper() -> Message:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        raised = True
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
            raised = False
        finally:
            if status is not None:
                label = str(status)
            elif disconnected and not raised:
                label = CLIENT_DISCONNECT
            else:
                label = "500"  # the server answers 500 for an app that raised or said nothing
            route: Any = scope.get("route")
            # A request abandoned inside the body guard never reached the router: its
            # route is unknown, and the label says so rather than guessing.
            template = getattr(route, "path", None) or UNMATCHED
            method = scope.get("method", "")
            elapsed = time.perf_counter() - start
            self.metrics.requests.labels(method, template, label).inc()
            self.metrics.latency.labels(method, template).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                access_log.info(
                    "request",
                    extra={
                        "method": method,
                        "path": scope.get("path", ""),
                        "route": template,
                        "status": label if status is None else status,
                        "duration_ms": round(elapsed * 1000, 3),
                    },
                )
