"""How the console writes sizes, times and ages."""

from __future__ import annotations

from datetime import datetime, timedelta

__all__ = ["age", "size", "when"]


def size(n: int | None) -> str:
    """Bytes in B, KB, MB, GB or TB (powers of 1000)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1000
    return f"{n} B"


def when(at: datetime | None) -> str:
    """A UTC timestamp to the second."""
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S UTC")


def age(delta: timedelta | None) -> str:
    """How long ago, in the largest whole unit."""
    if delta is None:
        return "-"
    seconds = int(delta.total_seconds())
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds // span} {unit} ago"
    return f"{seconds} s ago"
