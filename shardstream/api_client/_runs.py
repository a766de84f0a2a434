"""The run and checkpoint methods of :class:`~shardstream.api_client.APIClient`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from shardstream.errors import NotFoundError, RequestValidationError
from shardstream.wire import (
    MAX_RANKS,
    AttemptCreate,
    AttemptPublic,
    CheckpointCreate,
    CheckpointPublic,
    InputStatsReport,
    RunCreate,
    RunInputStats,
    RunMixtureHistory,
    RunPublic,
    RunSource,
    RunStatus,
    RunUpdate,
)

from ._session import APISession, json_body

B = TypeVar("B")


def _checked(build: Callable[[], B]) -> B:
    """``build()``, a request body validated here as the server would: what the server
    would refuse with a 422 (a position or schedule beyond the bounds on runs) is a
    :class:`RequestValidationError` naming the field, before anything is sent."""
    try:
        return build()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise RequestValidationError(problems, 422) from None


class RunsAPI(APISession):
    """Register runs, set their status, commit and read their checkpoints."""

    def create_run(
        self,
        sources: Sequence[RunSource | tuple[str, int] | tuple[str, int, float]],
        *,
        global_batch_size: int,
        seed: int = 0,
        plan: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> RunPublic:
        """Register a run reading ``sources`` ((dataset, version[, weight]) or RunSource)."""
        srcs = [_source(s) for s in sources]
        body = _checked(
            lambda: RunCreate(
                name=name,
                sources=srcs,
                seed=seed,
                global_batch_size=global_batch_size,
                plan=dict(plan or {}),
            )
        )
        return self._model(RunPublic, self.request("POST", "/v1/runs", json=json_body(body)))

    def get_run(self, run_id: int) -> RunPublic:
        """One run."""
        return self._model(RunPublic, self.request("GET", f"/v1/runs/{run_id}"))

    def list_runs(self, *, page_size: int = 100) -> Iterator[RunPublic]:
        """Every run the token may read."""
        return self._pages("/v1/runs", RunPublic, limit=page_size)

    def set_run_status(self, run_id: int, status: RunStatus | str) -> RunPublic:
        """Mark a run completed, failed, cancelled (or running again)."""
        body = RunUpdate(status=RunStatus(status))
        return self._model(
            RunPublic, self.request("PATCH", f"/v1/runs/{run_id}", json=json_body(body))
        )

    def commit_checkpoint(
        self,
        run_id: int,
        *,
        step: int,
        epoch: int,
        sample_in_epoch: int,
        plan: Mapping[str, Any] | None = None,
        attempt: int | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> CheckpointPublic:
        """Commit the data position at ``step`` (same state again is a no-op; else 409),
        as attempt ``attempt`` of the run (see :meth:`register_attempt`); ``stats``: this
        rank's input figures since its previous commit (``InputStats.report``)."""
        body = _checked(
            lambda: CheckpointCreate(
                step=step,
                epoch=epoch,
                sample_in_epoch=sample_in_epoch,
                plan=dict(plan or {}),
                attempt=attempt,
                stats=None if stats is None else InputStatsReport.model_validate(dict(stats)),
            )
        )
        path = f"/v1/runs/{run_id}/checkpoints"
        return self._model(CheckpointPublic, self.request("POST", path, json=json_body(body)))

    def input_stats(
        self, run_id: int, *, limit: int | None = None, cursor: str | None = None
    ) -> RunInputStats:
        """Is the run waiting for data? Its verdict and figures over all its ranks, and
        its ``limit`` slowest ranks' figures (the server's default: 32; at most 256),
        after ``cursor`` (a previous answer's ``next_cursor``)."""
        path = f"/v1/runs/{run_id}/input-stats"
        params = {"limit": limit, "cursor": cursor}
        return self._model(RunInputStats, self.request("GET", path, params=params))

    def input_stats_all_ranks(self, run_id: int) -> RunInputStats:
        """:meth:`input_stats` with every rank that reported, slowest first (a page of
        256 ranks a request)."""
        first = self.input_stats(run_id, limit=MAX_RANKS)
        ranks, cursor = list(first.ranks), first.next_cursor
        while cursor is not None:
            page = self.input_stats(run_id, limit=MAX_RANKS, cursor=cursor)
            ranks += page.ranks
            cursor = page.next_cursor
        return first.model_copy(update={"ranks": ranks, "next_cursor": None})

    def run_mixture(self, run_id: int) -> RunMixtureHistory:
        """The run's mixture over training (``GET /v1/runs/{id}/mixture``): per window of
        global steps, each source's samples (and tokens, where known) beside the weights
        its schedule planned, and where the phases end (in steps, and in tokens for a
        schedule in tokens). ``scheduled`` is false, with no windows, for a run without a
        schedule the server can count."""
        path = f"/v1/runs/{run_id}/mixture"
        return self._model(RunMixtureHistory, self.request("GET", path))

    def get_checkpoint(self, run_id: int, step: int) -> CheckpointPublic:
        """The checkpoint at ``step`` (NotFoundError if none)."""
        path = f"/v1/runs/{run_id}/checkpoints/{step}"
        return self._model(CheckpointPublic, self.request("GET", path))

    def latest_checkpoint(self, run_id: int) -> CheckpointPublic | None:
        """The newest checkpoint, or None when the run has none yet."""
        try:
            path = f"/v1/runs/{run_id}/checkpoints/latest"
            return self._model(CheckpointPublic, self.request("GET", path))
        except NotFoundError:
            self.get_run(run_id)  # a missing run is still an error
            return None

    def list_checkpoints(self, run_id: int, *, page_size: int = 100) -> Iterator[CheckpointPublic]:
        """A run's checkpoints by step."""
        return self._pages(f"/v1/runs/{run_id}/checkpoints", CheckpointPublic, limit=page_size)

    def register_attempt(self, run_id: int, body: AttemptCreate) -> AttemptPublic:
        """Register (or, from another rank of the same start, join) one start of the run;
        ConflictError names why a resume point is refused."""
        path = f"/v1/runs/{run_id}/attempts"
        return self._model(AttemptPublic, self.request("POST", path, json=json_body(body)))

    def list_attempts(self, run_id: int, *, page_size: int = 100) -> list[AttemptPublic]:
        """The run's attempts (its ledger of starts) by number, fetched a page at a time."""
        return list(self._pages(f"/v1/runs/{run_id}/attempts", AttemptPublic, limit=page_size))

    def audit_run(self, run_id: int) -> dict[str, Any]:
        """The audit of the run's effective history (``ok``: proven; see docs/server.md).
        Its lists hold their first entries beside their full counts (``attempt_count``...);
        :meth:`list_attempts` has every attempt."""
        report: dict[str, Any] = self.request("GET", f"/v1/runs/{run_id}/audit").json()
        return report


def _source(spec: RunSource | tuple[str, int] | tuple[str, int, float]) -> RunSource:
    if isinstance(spec, RunSource):
        return spec
    weight = float(spec[2]) if len(spec) > 2 else 1.0
    return RunSource(dataset=spec[0], version=spec[1], weight=weight)
