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
    ``phase_ends`` the steps where the schedule's phases end (its ``until`` values, or for
    a schedule whose phases end by tokens the steps those become). A schedule in tokens
    also gives ``tokens_per_step`` (the tokens a global step consumes) and
    ``phase_end_tokens``, its ``until_tokens`` values beside ``phase_ends`` (empty for a
    schedule in steps); :meth:`phase_end_labels` words each end as the console shows it."""

    run_id: int
    sources: list[str]
    scheduled: bool
    step: int | None = None
    window_steps: int = 1
    tokens_per_sample: list[int | None]
    phase_ends: list[int] = []
    tokens_per_step: int | None = None
    phase_end_tokens: list[int] = []
    windows: list[MixtureWindow] = []

    def phase_end_labels(self) -> list[str]:
        """Each phase end as people read it: ``"step 10"``, or for a schedule in tokens
        ``"2.0B tokens (step 123)"``."""
        tokens: list[int | None] = list(self.phase_end_tokens)
        if len(tokens) != len(self.phase_ends):
            tokens = [None] * len(self.phase_ends)
        return [phase_end_text(step, t) for step, t in zip(self.phase_ends, tokens, strict=True)]


def token_count_text(tokens: int) -> str:
    """A count of tokens in short form: ``950``, ``12.5K``, ``2.0B``, ``1.25T`` (at most
    three decimals; the exact count goes beside it where it matters)."""
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(tokens) >= scale:
            text = f"{tokens / scale:.3f}".rstrip("0")
            return (text + "0" if text.endswith(".") else text) + unit
    return str(tokens)


def phase_end_text(step: int, tokens: int | None = None) -> str:
    """Where a phase ends: ``"step 10"``, or ``"2.0B tokens (step 123)"`` for a phase that
    ends by tokens (at ``tokens``, reached at global ``step``)."""
    if tokens is None:
        return f"step {step:,}"
    return f"{token_count_text(tokens)} tokens (step {step:,})"
