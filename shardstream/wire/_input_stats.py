"""A rank's input figures, sent with its checkpoint commits (is training waiting for data?).

A fixed set of numbers (a few hundred bytes as JSON), so a commit stays small whatever the
job: the client's :mod:`shardstream.client.batches.input_stats` measures them since the rank's
previous commit; the server keeps each rank's latest and their totals per run.

Two sets of bounds: a rank's totals (:class:`InputFigures`) stay within what every
database and JSON reader holds exactly (counts up to 2**62, seconds up to 1e12), and one
commit's window (:class:`InputStatsReport`) within far less (counts up to 2**53, seconds
up to 1e9, about 31 years), so no window is refused for a real job while a figure past
them is a 422 naming it; the server saturates the totals at their bounds
(:func:`saturated`), so a run's views never break on a sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator

from ._fields import MAX_INT, Count, PublicModel, StrictModel

LATENCY_BUCKETS_S: tuple[float, ...] = (0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)
"""Upper bounds of the batch-ready latency histogram (a last, open bucket holds the rest)."""
LATENCY_BUCKETS = len(LATENCY_BUCKETS_S) + 1


def percentiles(counts: Sequence[int], qs: Sequence[float] = (0.5, 0.95, 0.99)) -> list[float]:
    """The ``qs`` quantiles of a :data:`LATENCY_BUCKETS_S` histogram in milliseconds (a
    bucket's upper bound; the last, open bucket reports twice the largest bound); empty
    for an empty histogram."""
    total = sum(counts)
    if not total:
        return []
    bounds = [b * 1000 for b in LATENCY_BUCKETS_S] + [LATENCY_BUCKETS_S[-1] * 2000]
    out = []
    for q in qs:
        rank, seen = q * total, 0
        for bound, n in zip(bounds, counts, strict=True):
            seen += n
            if seen >= rank:
                out.append(bound)
                break
    return out


MAX_WORLD_SIZE = 1 << 20

MAX_TOTAL_S = 1e12
"""The most seconds a figure holds (a rank's total saturates there)."""
MAX_WINDOW_S = 1e9
"""The most seconds one commit's window may report for a figure."""
MAX_WINDOW_COUNT = 2**53
"""The most one commit's window may report for a count (exact as a JSON number)."""

Seconds = Annotated[float, Field(ge=0, le=MAX_TOTAL_S, allow_inf_nan=False)]


class Verdict(StrEnum):
    """Whether a rank's training waits for its input, and on what: the one home of these
    names (the client gives them, the server counts them, the CLI and console show them).
    Plain strings on the wire and in the database (a :class:`~enum.StrEnum`: equal to, and
    formatted as, its value)."""

    UNKNOWN = "unknown"
    """Too few batches timed to say."""
    NOT_INPUT_BOUND = "not_input_bound"
    IO_BOUND = "io_bound"
    """Input-bound, the building threads mostly waiting on storage or the network."""
    CPU_BOUND = "cpu_bound"
    """Input-bound, the building threads mostly busy on a CPU (decoding, transforms)."""


INPUT_BOUND: tuple[Verdict, ...] = (Verdict.IO_BOUND, Verdict.CPU_BOUND)
"""The verdicts of a rank whose training waits for data."""

COUNTS = (
    "batches",
    "storage_requests",
    "storage_bytes",
    "throttled",
    "retries",
    "peer_bytes",
    "cache_hits",
    "cache_misses",
    "packed_tokens",
    "truncated_tokens",
)
"""The counts a window adds to a rank's totals."""
SECONDS = ("data_wait_s", "step_s", "first_batch_s", "build_s", "build_cpu_s")
"""The times a window adds to a rank's totals."""


def saturated(name: str, value: float) -> float:
    """``value`` of figure ``name`` held to its total's bound (sums stop there)."""
    return min(value, MAX_TOTAL_S) if name in SECONDS else min(int(value), MAX_INT)


class InputFigures(PublicModel):
    """One rank's input figures: a commit's window, or the rank's totals since it first
    reported (bounded as totals; see the module doc)."""

    rank: Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]
    world_size: Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
    batches: Count
    data_wait_s: Seconds
    step_s: Seconds
    first_batch_s: Seconds = 0.0
    latency_counts: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_INT)]],
        Field(min_length=LATENCY_BUCKETS, max_length=LATENCY_BUCKETS),
    ]
    storage_requests: Count = 0
    storage_bytes: Count = 0
    throttled: Count = 0
    retries: Count = 0
    peer_bytes: Count = 0
    cache_hits: Count = 0
    cache_misses: Count = 0
    packed_tokens: Count = 0
    """Document tokens read-time packing placed in rows."""
    truncated_tokens: Count = 0
    """Document tokens read-time packing cut (fixed rows that did not hold them)."""
    build_s: Seconds = 0.0
    build_cpu_s: Seconds = 0.0
    ring_occupancy: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    workers: Annotated[int, Field(ge=0, le=4096)] = 0
    verdict: Verdict = Verdict.UNKNOWN


class InputStatsReport(InputFigures):
    """One rank's input figures over the window since its previous commit, as sent: a
    request (unknown fields refused), each figure within one window's bounds."""

    model_config = StrictModel.model_config

    @field_validator(*COUNTS)
    @classmethod
    def _one_window_count(cls, value: int) -> int:
        if value > MAX_WINDOW_COUNT:
            raise ValueError(
                f"{value} is more than one commit's window can count (at most "
                f"{MAX_WINDOW_COUNT}, 2**53)"
            )
        return value

    @field_validator(*SECONDS)
    @classmethod
    def _one_window_seconds(cls, value: float) -> float:
        if value > MAX_WINDOW_S:
            raise ValueError(
                f"{value:g} s is more than one commit's window can last (at most "
                f"{MAX_WINDOW_S:g} s)"
            )
        return value

    @field_validator("latency_counts")
    @classmethod
    def _one_window_latencies(cls, value: list[int]) -> list[int]:
        for i, n in enumerate(value):
            if n > MAX_WINDOW_COUNT:
                raise ValueError(
                    f"bucket {i}: {n} batches is more than one commit's window can count "
                    f"(at most {MAX_WINDOW_COUNT}, 2**53)"
                )
        return value


MAX_HISTORY = 32
"""Commits whose wait share the server keeps per rank (the newest)."""
MAX_MISSING_LISTED = 1000


class RankInputStats(PublicModel):
    """What the server keeps of one rank of a run: its latest window, its totals since
    it first reported, and the wait share of its recent commits (oldest first, ``[step,
    share]`` pairs, at most :data:`MAX_HISTORY`)."""

    rank: int
    world_size: int
    step: int
    verdict: str
    wait_share: float
    latest: InputFigures
    total: InputFigures
    history: list[tuple[int, float]]
    updated_at: datetime


class RunInputSummary(PublicModel):
    """A run's input verdict in a few numbers, for lists of runs (``GET /v1/runs``):
    counted from each rank's latest verdict, without reading its figures."""

    verdict: str
    """As :class:`RunInputStats`: ``io_bound``/``cpu_bound`` if any rank is (the more
    common, ``io_bound`` on a tie), else ``not_input_bound`` or ``unknown``."""
    ranks_reporting: int
    ranks_input_bound: int
    world_size: int | None
    max_wait_share: float | None
    """The slowest rank's wait share (its latest window)."""


DEFAULT_RANKS = 32
"""Ranks ``GET /v1/runs/{id}/input-stats`` returns by default (the slowest)."""
MAX_RANKS = 256
"""The most ranks one answer holds (``limit``): about 1.3 KB each, so an answer stays
well under half a megabyte whatever the world size; ``next_cursor`` pages on."""


class RunInputStats(PublicModel):
    """A run's input figures: its slowest ranks (highest wait share first, a page of at
    most ``limit``; ``next_cursor`` gives the next), the run's verdict (the most common
    among input-bound ranks, if at least one rank is input-bound, ``io_bound`` on a tie),
    the figures over all ranks that reported (``wait_share``, ``ranks_reporting``,
    ``verdict_counts``) and the ranks that never reported (below the largest world size
    reported; at most :data:`MAX_MISSING_LISTED` listed, ``missing_count`` all of them)."""

    run_id: int
    world_size: int | None
    verdict: str
    wait_share: float | None
    """Data wait over data wait plus step, summed over the ranks' totals."""
    ranks: list[RankInputStats]
    missing: list[int]
    missing_count: int
    ranks_reporting: int = 0
    verdict_counts: dict[str, int] = Field(default_factory=dict)
    """Ranks per verdict (of their latest window)."""
    next_cursor: str | None = None
    """Pass back as ``cursor`` for the next slowest ranks (None: no more)."""
