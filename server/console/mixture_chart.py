"""The run page's mixture over training: per source, its share of the samples (and of the
tokens, where known) in each window of global steps, beside the share its schedule planned,
as an inline SVG (no script, nothing fetched: the console's security policy stays as it is).

Each source is one colour: a solid step line for its share of the window's samples, a
dotted one for its share of the tokens, a dashed one for the planned weight; thin
vertical lines mark where the schedule's phases end (named in tokens, with their step, for
a schedule whose phases end by tokens). Hovering a window names every
drawn source's figures in it. Only numbers and escaped names go into the SVG.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardstream.wire import MixtureWindow, RunMixtureHistory, token_count_text

__all__ = ["COLORS", "Legend", "mixture_chart"]

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563")
"""One per drawn source; a run with more sources draws its largest :data:`COLORS` ones."""


@dataclass(frozen=True)
class Legend:
    """One drawn source: its colour and its figures in the latest window."""

    color: str
    name: str
    share: float | None  # of the latest window's samples
    token_share: float | None
    planned: float


def _share(values: Sequence[int] | None, s: int) -> float | None:
    if values is None:
        return None
    total = sum(values)
    return values[s] / total if total > 0 else None


def _step_line(
    windows: Sequence[MixtureWindow],
    value: Callable[[MixtureWindow], float | None],
    x: Callable[[int], float],
    y: Callable[[float], float],
) -> list[str]:
    """Polylines' points through each window's value (a gap where a window has none)."""
    lines: list[str] = []
    points: list[str] = []
    for window in windows:
        v = value(window)
        if v is None:
            if points:
                lines.append(" ".join(points))
            points = []
            continue
        points += [f"{x(window.start):.1f},{y(v):.1f}", f"{x(window.stop):.1f},{y(v):.1f}"]
    if points:
        lines.append(" ".join(points))
    return lines


def mixture_chart(
    history: RunMixtureHistory, *, width: int = 760, height: int = 240
) -> tuple[str, list[Legend]]:
    """The chart and its legend (``("", [])`` for a run with no windows yet)."""
    windows = [w for w in history.windows if w.stop > w.start]
    if not windows or not history.sources:
        return "", []
    n = len(history.sources)
    totals = [sum(w.samples[s] for w in windows) for s in range(n)]
    drawn = sorted(range(n), key=lambda s: (-totals[s], s))[: len(COLORS)]
    left, right, top, bottom = 50, 20, 16, 34
    end = windows[-1].stop

    def x(step: int) -> float:
        return left + step / end * (width - left - right)

    def y(share: float) -> float:
        return height - bottom - max(0.0, min(1.0, share)) * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="each source\'s share per window of steps">',
        f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" class="axis"/>',
    ]
    for share in (0.0, 0.5, 1.0):
        parts.append(
            f'<text x="{left - 6}" y="{y(share) + 4:.1f}" text-anchor="end" class="tick">'
            f"{share:.0%}</text>"
        )
    parts.append(f'<text x="{left}" y="{height - 10}" class="tick">step 0</text>')
    last = f"step {end:,}"
    if history.tokens_per_step is not None:  # a schedule in tokens: the run's tokens too
        last = f"{token_count_text(end * history.tokens_per_step)} tokens ({last})"
    parts.append(
        f'<text x="{width - right}" y="{height - 10}" text-anchor="end" class="tick">'
        f"{html.escape(last)}</text>"
    )
    for until, label in zip(history.phase_ends, history.phase_end_labels(), strict=True):
        if 0 < until < end:
            parts.append(
                f'<line x1="{x(until):.1f}" y1="{top}" x2="{x(until):.1f}" y2="{y(0)}" '
                f'class="phase-end"><title>a phase ends at {html.escape(label)}</title></line>'
            )
    for color, s in zip(COLORS, drawn, strict=False):
        lines = [
            ("planned", "5 4", lambda w, s=s: w.planned[s]),
            ("samples", "", lambda w, s=s: _share(w.samples, s)),
            ("tokens", "1 3", lambda w, s=s: _share(w.tokens, s)),
        ]
        for kind, dashes, value in lines:
            for points in _step_line(windows, value, x, y):
                dash = f' stroke-dasharray="{dashes}"' if dashes else ""
                parts.append(
                    f'<polyline class="share {kind}" fill="none" stroke="{color}" '
                    f'stroke-width="{1.2 if dashes else 2}"{dash} points="{points}"/>'
                )
    for window in windows:
        hover = html.escape(_hover(history, window, drawn))
        parts.append(
            f'<rect class="window" x="{x(window.start):.1f}" y="{top}" '
            f'width="{max(x(window.stop) - x(window.start), 0.5):.1f}" height="{y(0) - top}" '
            f'fill="transparent"><title>{hover}</title></rect>'
        )
    parts.append("</svg>")
    latest = windows[-1]
    legend = [
        Legend(
            color,
            history.sources[s],
            _share(latest.samples, s),
            _share(latest.tokens, s),
            latest.planned[s],
        )
        for color, s in zip(COLORS, drawn, strict=False)
    ]
    return "".join(parts), legend


def _hover(history: RunMixtureHistory, window: MixtureWindow, drawn: Sequence[int]) -> str:
    head = f"steps {window.start:,}-{window.stop:,}" + (" (so far)" if window.open else "")
    rows = []
    for s in drawn:
        share = _share(window.samples, s)
        text = f"{history.sources[s]}: " + (f"{share:.1%} of samples" if share is not None else "-")
        tokens = _share(window.tokens, s)
        if tokens is not None:
            text += f", {tokens:.1%} of tokens"
        rows.append(f"{text} (planned {window.planned[s]:.1%})")
    return head + ": " + "; ".join(rows)
