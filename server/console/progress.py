"""Where a run stands, from its checkpoints: progress, staleness, and the samples chart.

A checkpoint records the epoch and the samples consumed in it; the reader's state (its
``plan``) says how many samples an epoch holds. Clients also record the world size and a
session id per training process (:func:`shardstream.client._server.commit_checkpoint`),
so the chart can mark where a run was resumed and where its number of ranks changed.
The chart is an inline SVG drawn here: no chart library, nothing fetched by the browser.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shardstream.server.data.epoch_size import epoch_samples
from shardstream.server.models import CheckpointRow, RunRow, RunSourceRow, utcnow
from shardstream.wire import stored_plan_params

STALE_AFTER = timedelta(hours=1)
"""A running run whose last checkpoint (or start) is older than this is highlighted."""


@dataclass(frozen=True)
class Point:
    """One checkpoint on the chart."""

    step: int
    at: datetime
    samples: int  # consumed since the start of the run
    epoch: int
    sample_in_epoch: int
    world_size: int | None
    resumed: bool  # the first checkpoint of a new training process
    world_changed: bool


@dataclass(frozen=True)
class RunProgress:
    """A run's position: the latest checkpoint read against the epoch's size."""

    epoch_samples: int | None
    epoch: int | None
    sample_in_epoch: int | None
    total_samples: int | None
    last_checkpoint: datetime | None
    stale: bool
    trained_samples: int | None = None  # an epoch's samples the loader yields (see below)

    @property
    def epoch_fraction(self) -> float | None:
        """Share of the current epoch's trained samples consumed (None without a
        checkpoint or epoch size): a dropped tail is never trained, so an epoch read to
        its end shows 100 %."""
        per_epoch = self.trained_samples or self.epoch_samples
        if per_epoch and self.sample_in_epoch is not None:
            return min(1.0, self.sample_in_epoch / per_epoch)
        return None

    def age(self, now: datetime | None = None) -> timedelta | None:
        """Time since the last checkpoint."""
        if self.last_checkpoint is None:
            return None
        return (now or utcnow()) - self.last_checkpoint


def trained_samples(plan: dict[str, Any], per_epoch: int | None, batch: int) -> int | None:
    """The samples an epoch of ``per_epoch`` yields in whole global batches of ``batch``:
    the partial last batch dropped (``tail="drop"``, the default) or padded
    (``tail="pad"``), as the plan does; the plan's own ``global_batch_size`` wins."""
    params = stored_plan_params(plan)
    size = params.get("global_batch_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        batch = size
    if not per_epoch or batch <= 0:
        return per_epoch
    padded = params.get("tail") == "pad"
    batches = -(-per_epoch // batch) if padded else per_epoch // batch
    return batches * batch


def progress(
    run: RunRow,
    latest: CheckpointRow | None,
    sources: Sequence[tuple[RunSourceRow, int]],
    now: datetime | None = None,
) -> RunProgress:
    """The run's progress from its latest checkpoint."""
    now = now or utcnow()
    plan = latest.plan if latest is not None else run.plan
    per_epoch = epoch_samples(plan, sources)
    last = latest.created_at if latest is not None else None
    stale = run.status == "running" and (now - (last or run.created_at)) > STALE_AFTER
    trained = trained_samples(plan, per_epoch, run.global_batch_size)
    if latest is None:
        return RunProgress(per_epoch, None, None, None, None, stale, trained)
    total = latest.epoch * per_epoch + latest.sample_in_epoch if per_epoch else None
    return RunProgress(per_epoch, latest.epoch, latest.sample_in_epoch, total, last, stale, trained)


def points(checkpoints: Sequence[CheckpointRow], per_epoch: int | None) -> list[Point]:
    """Chart points in step order, with resumes and world-size changes marked."""
    out: list[Point] = []
    prev_session: object = None
    prev_world: int | None = None
    for i, row in enumerate(checkpoints):
        session = row.plan.get("session")
        world = row.plan.get("world_size")
        world = world if isinstance(world, int) else None
        samples = row.epoch * (per_epoch or 0) + row.sample_in_epoch
        resumed = i > 0 and session is not None and session != prev_session
        changed = i > 0 and None not in (world, prev_world) and world != prev_world
        out.append(
            Point(
                row.step,
                row.created_at,
                samples,
                row.epoch,
                row.sample_in_epoch,
                world,
                resumed,
                changed,
            )
        )
        prev_session, prev_world = session, world
    return out


def chart_svg(pts: Sequence[Point], *, width: int = 760, height: int = 260) -> str:
    """Samples consumed over time as an inline SVG (empty string for no points)."""
    if not pts:
        return ""
    left, right, top, bottom = 70, 20, 20, 40
    t0 = pts[0].at.timestamp()
    span_t = max(pts[-1].at.timestamp() - t0, 1e-9)
    top_y = max(p.samples for p in pts) or 1

    def x(p: Point) -> float:
        return left + (p.at.timestamp() - t0) / span_t * (width - left - right)

    def y(p: Point) -> float:
        return height - bottom - p.samples / top_y * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="samples consumed over time">',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
        'class="axis"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" class="axis"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" class="tick">{top_y:,}</text>',
        f'<text x="{left - 6}" y="{height - bottom}" text-anchor="end" class="tick">0</text>',
        f'<text x="{left}" y="{height - 12}" class="tick">{_clock(pts[0].at)}</text>',
        f'<text x="{width - right}" y="{height - 12}" text-anchor="end" class="tick">'
        f"{_clock(pts[-1].at)}</text>",
    ]
    for p in pts:
        if p.resumed or p.world_changed:
            label = "resumed" if p.resumed else ""
            if p.world_changed:
                label = (label + ", " if label else "") + f"{p.world_size} ranks"
            kind = "world" if p.world_changed else "resume"
            parts.append(
                f'<line x1="{x(p):.1f}" y1="{top}" x2="{x(p):.1f}" y2="{height - bottom}" '
                f'class="mark {kind}"><title>step {p.step}: {html.escape(label)}</title></line>'
                f'<text x="{x(p) + 3:.1f}" y="{top + 10}" class="mark-label">'
                f"{html.escape(label)}</text>"
            )
    line = " ".join(f"{x(p):.1f},{y(p):.1f}" for p in pts)
    parts.append(f'<polyline points="{line}" class="series"/>')
    for p in pts:
        parts.append(
            f'<circle cx="{x(p):.1f}" cy="{y(p):.1f}" r="3" class="point">'
            f"<title>step {p.step}: {p.samples:,} samples (epoch {p.epoch})</title></circle>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _clock(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")
