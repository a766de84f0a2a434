"""A run's mixture over training (``GET /v1/runs/{id}/mixture``): per window of global
steps, the samples (and tokens, where known) each source gave, beside the weights the
run's schedule planned for that window. Bounded: at most
:data:`MAX_MIXTURE_WINDOWS` windows (plus the one still filling) whatever the run's length.
"""

from __future__ import annotations

from ._fields import PublicModel

MAX_MIXTURE_WINDOWS = 64
"""Finished windows kept per run; a longer run's windows are merged in pairs (doubling
their width), so they always cover the whole run."""


class MixtureWindow(PublicModel):
    """Global steps ``[start, stop)`` of a run (batches since its start, the schedule's
    axis): per source (the run's order), the samples it gave, their tokens (``None`` unless
    every source's samples have a fixed token count) and the schedule's weights over the
    window (normalized, averaged over its steps). ``open``: the window the latest
    checkpoint is in, counted up to it."""

    start: int
    stop: int
    samples: list[int]
    tokens: list[int] | None = None
    planned: list[float]
    open: bool = False


class RunMixtureHistory(PublicModel):
    """A run's mixture over training, oldest window first.

    ``scheduled`` is false (and ``windows`` empty) when the run's latest plan has no
    mixture schedule the server can read; ``step`` is the global step of the latest
    checkpoint (``None`` before any); ``window_steps`` the width of the finished windows;
    ``phase_ends`` the steps where the schedule's phases end (its ``until`` values)."""

    run_id: int
    sources: list[str]
    scheduled: bool
    step: int | None = None
    window_steps: int = 1
    tokens_per_sample: list[int | None]
    phase_ends: list[int] = []
    windows: list[MixtureWindow] = []
