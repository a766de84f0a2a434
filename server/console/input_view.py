"""The run page's input section: data-wait share over time per rank, as a small SVG."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["sparkline"]

WIDTH, HEIGHT = 160, 24


def sparkline(history: Sequence[tuple[int, float]]) -> str:
    """An inline SVG of a rank's wait share per commit (0 at the bottom, 100 % at the top);
    a dashed line marks the input-bound threshold (10 %). Only numbers go into it."""
    if not history:
        return ""
    n = len(history)
    xs = [WIDTH / 2] if n == 1 else [i * WIDTH / (n - 1) for i in range(n)]
    ys = [HEIGHT - max(0.0, min(1.0, float(share))) * HEIGHT for _, share in history]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    limit = HEIGHT - 0.1 * HEIGHT
    last_x, last_y = xs[-1], ys[-1]
    return (
        f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="data-wait share over the last {n} commits">'
        f'<line x1="0" y1="{limit:.1f}" x2="{WIDTH}" y2="{limit:.1f}" stroke="#f59e0b" '
        'stroke-dasharray="3,3" stroke-width="1"/>'
        f'<polyline fill="none" stroke="#2563eb" stroke-width="1.5" points="{points}"/>'
        f'<circle cx="{last_x:.1f}" cy="{last_y:.1f}" r="2" fill="#2563eb"/></svg>'
    )
