"""``shardstream runs show``'s mixture section: each source's share of the run's recent
windows of global steps, beside the weight its schedule planned."""

from __future__ import annotations

from shardstream.wire import MixtureWindow, RunMixtureHistory, phase_end_text

__all__ = ["RECENT_WINDOWS", "SOURCES_SHOWN", "mixture_lines"]

RECENT_WINDOWS = 8
"""Windows listed (the latest); --json has them all."""

SOURCES_SHOWN = 8
"""Sources given a column (the largest over the listed windows, as the console draws)."""


def mixture_lines(history: RunMixtureHistory) -> list[str]:
    """The run's mixture over its recent windows (``GET /v1/runs/{id}/mixture``) as lines
    for a terminal; none for a run without a schedule the server can count."""
    if not history.scheduled:
        return []
    ends = history.phase_end_labels()
    head = "mixture: " + (f"phases end at {', '.join(ends)}" if ends else "one phase")
    if history.step is None:
        return [head + "; no checkpoint yet"]
    per_step = history.tokens_per_step
    where = phase_end_text(history.step, None if per_step is None else history.step * per_step)
    width = history.window_steps
    head += f"; now at {where}; windows of {width:,} step{'' if width == 1 else 's'}"
    windows = [w for w in history.windows if w.stop > w.start][-RECENT_WINDOWS:]
    if not windows:
        return [head]
    n = len(history.sources)
    totals = [sum(w.samples[s] for w in windows) for s in range(n)]
    shown = sorted(sorted(range(n), key=lambda s: (-totals[s], s))[:SOURCES_SHOWN])
    tokens = all(w.tokens is not None for w in windows)
    what = "share of samples / of tokens (planned)" if tokens else "share of samples (planned)"
    rows = [["steps", *(history.sources[s] for s in shown)]]
    for window in windows:
        span = f"{window.start:,}-{window.stop:,}" + (" (so far)" if window.open else "")
        rows.append([span, *(_cell(window, s, tokens) for s in shown)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [head, f"each source's {what} in the latest windows:", ""]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    left = []
    if len(history.windows) > len(windows):
        left.append(f"{len(history.windows) - len(windows)} earlier windows")
    if n > len(shown):
        left.append(f"{n - len(shown)} more sources")
    if left:
        lines.append(f"... {' and '.join(left)} (--json lists them all)")
    return lines


def _share(values: list[int] | None, s: int) -> str:
    total = sum(values) if values is not None else 0
    return "-" if values is None or total <= 0 else f"{values[s] / total:.1%}"


def _cell(window: MixtureWindow, s: int, tokens: bool) -> str:
    share = _share(window.samples, s)
    if tokens:
        share += f" / {_share(window.tokens, s)}"
    return f"{share} ({window.planned[s]:.1%})"
