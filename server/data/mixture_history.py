"""A run's mixture over training: per window of global steps, the samples (and tokens,
where a sample's token count is fixed) each source gave, beside the weights the run's
schedule planned for that window.

**Where the figures come from.** A checkpoint commit records the run's position
(``epoch``, ``sample_in_epoch``) and its plan (the schedule, the global batch size, the tail
rule, the epoch size). The plan is a pure function of those: which source each sample of
a global step comes from is fixed by the plan's arithmetic
(:mod:`shardstream.plan`), and the audit proves the run consumed the
plan's batches in order. So the samples a source gave over steps ``[a, b)`` are counted
here from the plan, with no extra figures from the client, as differences of cumulative
counts (:meth:`MixturePlan.cumulative`): whole segments (constant pieces of the schedule
within an epoch) exactly, a segment a window cuts in proportion (inside a segment the plan
mixes its sources evenly), only the samples batches read (never an epoch's dropped tail),
so the windows add up to steps x global batch exactly. Tokens are samples
times the source's tokens per sample, known when its version's token column has a fixed
shape (``ndarray:<dtype>:<seq_len>``, what ``build text`` writes; the rule is
:func:`shardstream.mds.tokens_per_sample`, the one the client's schedules in tokens read);
documents of varying length have none, and then the run has no token figures.

**Bounded.** A run's row keeps at most :data:`MAX_MIXTURE_WINDOWS` finished windows of
equal width (window ``i`` is steps ``[i w, (i + 1) w)``); when the run's position passes
the last of them, neighbouring windows are merged in pairs and the width doubles, so the
windows always cover the whole run and a row holds at most ``64 x sources x 2`` numbers
whatever the client commits. Each window is counted when a commit first passes it (with
the plan of that commit: a plan changed on a resume counts from there on), a rollback
drops the windows after the position it went back to, and the window the run is in is
counted when read, up to the latest checkpoint. Counting a window costs O(schedule pieces
it spans), never O(epochs): runs of whole epochs inside one piece are counted at once.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.errors import PlanError, RequestValidationError
from shardstream.mds import tokens_per_sample
from shardstream.plan import MixtureSchedule, segment_counts, segments_of, split_by_weights
from shardstream.server.models import CheckpointRow, RunMixtureRow, RunSourceRow, VersionRow, utcnow
from shardstream.wire import (
    MAX_MIXTURE_WINDOWS,
    MAX_STEPS,
    MixtureWindow,
    RunMixtureHistory,
    stored_plan_params,
)

from . import runs as runs_data
from .epoch_size import MAX_EPOCH_SAMPLES, epoch_samples

__all__ = ["MAX_MIXTURE_WINDOWS", "MixturePlan", "for_run", "record"]

MAX_PIECES = 1024
"""Constant pieces a schedule may have for the server to count it (a stored plan is
whatever a client sent: a linear phase of a billion steps is not expanded)."""


@dataclass(frozen=True)
class MixturePlan:
    """A stored plan's schedule arithmetic: which source the samples of any range of
    global steps come from (see the module)."""

    schedule: MixtureSchedule
    batch: int
    epoch_samples: int
    num_batches: int
    starts: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]
    tokens_per_step: int | None = None
    """The tokens a global step consumes, for a schedule whose phases end by tokens."""
    phase_tokens: tuple[int | None, ...] = ()
    """Per phase of such a schedule, its ``until_tokens`` (``schedule`` holds the steps
    they become); empty for a schedule in steps."""
    _memo: dict[tuple[Any, ...], list[int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls, plan: Mapping[str, Any], num_sources: int, epoch_samples: int | None
    ) -> MixturePlan | None:
        """The arithmetic of ``plan`` (a checkpoint's or run's stored plan), or None when it
        has no schedule, or one this server cannot count for ``num_sources`` sources."""
        params = stored_plan_params(plan)
        if params.get("schedule") is None:
            return None
        batch = params.get("global_batch_size")
        if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
            return None
        if not epoch_samples or not 0 < epoch_samples <= MAX_EPOCH_SAMPLES:
            return None
        try:
            stored = MixtureSchedule.from_params(params["schedule"])
            # Phase ends in tokens are counted as the steps they are.
            schedule = stored.in_steps() if stored is not None else None
        except (PlanError, TypeError, ValueError):
            return None
        if schedule is None or schedule.num_sources != num_sources:
            return None
        if _piece_count(schedule) > MAX_PIECES:
            return None
        drop = params.get("tail", "drop") != "pad"
        num_batches = epoch_samples // batch if drop else -(-epoch_samples // batch)
        if num_batches < 1:
            return None
        pieces = schedule.pieces()
        return cls(
            schedule,
            batch,
            epoch_samples,
            num_batches,
            tuple(start for start, _ in pieces),
            tuple(weights for _, weights in pieces),
            stored.tokens_per_step if stored is not None and stored.in_tokens else None,
            tuple(p.until_tokens for p in stored.phases)
            if stored is not None and stored.in_tokens
            else (),
        )

    def phase_ends(self) -> list[tuple[int, int | None]]:
        """``(step, tokens)`` where each phase with an end ends; ``tokens`` is its
        ``until_tokens`` in a schedule whose phases end by tokens, else ``None``."""
        tokens = self.phase_tokens or (None,) * len(self.schedule.phases)
        return [
            (phase.until, t)
            for phase, t in zip(self.schedule.phases, tokens, strict=True)
            if phase.until is not None
        ]

    def position(self, epoch: int, sample_in_epoch: int) -> int:
        """The global step (batches since the run's start) of a checkpoint's position."""
        return epoch * self.num_batches + min(sample_in_epoch // self.batch, self.num_batches)

    def weights_at(self, step: int) -> tuple[float, ...]:
        """The weights in force at global ``step``, normalized to sum to 1."""
        weights = self.weights[bisect.bisect_right(self.starts, step) - 1]
        total = sum(weights) or 1.0
        return tuple(w / total for w in weights)

    def planned(self, lo: int, hi: int) -> list[float]:
        """The schedule's normalized weights averaged over global steps ``[lo, hi)``."""
        out = [0.0] * self.schedule.num_sources
        i = bisect.bisect_right(self.starts, lo) - 1
        while i < len(self.starts) and self.starts[i] < hi:
            stop = self.starts[i + 1] if i + 1 < len(self.starts) else hi
            span = min(stop, hi) - max(self.starts[i], lo)
            total = sum(self.weights[i]) or 1.0
            for s, w in enumerate(self.weights[i]):
                out[s] += span * w / total
            i += 1
        return [round(v / (hi - lo), 6) for v in out] if hi > lo else out

    def counts(self, lo: int, hi: int) -> list[int]:
        """Samples each source gave over global steps ``[lo, hi)``: the difference of the
        cumulative counts at ``hi`` and ``lo`` (:meth:`cumulative`), so they add up to
        ``(hi - lo) x global batch`` exactly, whatever the windows."""
        if hi <= lo:
            return [0] * self.schedule.num_sources
        before, upto = self.cumulative(lo), self.cumulative(hi)
        return [b - a for a, b in zip(before, upto, strict=True)]

    def cumulative(self, step: int) -> list[int]:
        """Samples each source gave over global steps ``[0, step)`` (``step x`` global batch
        in all): whole segments exactly as the plan splits them, a segment the step cuts
        by :func:`_within` (monotone, so no window is ever negative), only the samples the
        batches read (an epoch's dropped tail is never counted). O(pieces): the epochs one
        piece holds whole give the same, and are counted at once."""
        n = self.num_batches
        epoch, batch = divmod(step, n)
        out = [0] * self.schedule.num_sources
        cut = {start // n for start in self.starts[1:] if start % n and start // n < epoch}
        for e in cut:
            _add(out, self._epoch_part(e, n))
        for i, start in enumerate(self.starts):
            first = -(-start // n)
            stop = min(self.starts[i + 1] // n if i + 1 < len(self.starts) else epoch, epoch)
            if stop > first:
                _add(out, self._whole_epoch(i), stop - first)
        if batch:
            _add(out, self._epoch_part(epoch, batch))
        return out

    def _whole_epoch(self, piece: int) -> list[int]:
        """What an epoch inside piece ``piece`` reads of each source."""
        key = ("whole", piece)
        if key not in self._memo:
            counts = split_by_weights(self.epoch_samples, self.weights[piece])
            self._memo[key] = _within(self.epoch_samples, counts, self.num_batches * self.batch)
        return self._memo[key]

    def _epoch_part(self, epoch: int, upto: int) -> list[int]:
        """What batches ``[0, upto)`` of ``epoch`` read of each source (O(its segments))."""
        key = ("part", epoch, upto)
        if key in self._memo:
            return self._memo[key]
        pieces = list(zip(self.starts, self.weights, strict=True))
        segments = segments_of(pieces, epoch, self.num_batches)
        items = [(z - a) * self.batch for a, z, _ in segments]
        items[-1] = self.epoch_samples - segments[-1][0] * self.batch
        out = [0] * self.schedule.num_sources
        for (a, z, _), size, counts in zip(
            segments, items, segment_counts(segments, self.epoch_samples, self.batch), strict=True
        ):
            done = max(0, min(z, upto) - a)
            if done:
                _add(out, _within(size, counts, done * self.batch))
        if len(self._memo) < 4096:
            self._memo[key] = out
        return out


def _add(out: list[int], counts: Sequence[int], times: int = 1) -> None:
    for s, c in enumerate(counts):
        out[s] += c * times


def _within(items: int, counts: Sequence[int], taken: int) -> list[int]:
    """Each source's part of the first ``taken`` of a segment's ``items`` (``counts`` per
    source). Inside a segment the plan mixes its sources evenly; which exact samples the
    first batches hold is the plan's permutation, so the split is the proportional one,
    made by sequential floors: the first source takes ``floor(x c_0 / I)``, the next its
    part of what is left, and so on. Every part grows by 0 or 1 per sample taken (windows
    are never negative), they add up to ``taken`` exactly, and ``taken = items`` gives
    ``counts``. Past ``items`` (``tail="pad"``) the segment wraps around to its start."""
    if items <= 0:
        return [0] * len(counts)
    rounds, taken = divmod(taken, items)
    out = [rounds * c for c in counts]
    left_x, left_items = taken, items
    for s, c in enumerate(counts):
        take = left_x if s + 1 == len(counts) else (left_x * c // left_items if left_items else 0)
        out[s] += take
        left_x, left_items = left_x - take, left_items - c
    return out


def _piece_count(schedule: MixtureSchedule) -> int:
    """At least the pieces :meth:`MixtureSchedule.pieces` would make, without making them:
    a constant phase is one, a linear one at most its ``steps`` (fewer when it is
    shorter)."""
    count, start = 1, 0
    for phase in schedule.phases:
        if phase.end_weights is None:
            count += 1
        elif phase.until is None:
            count += phase.steps
        else:
            count += min(phase.steps, max(1, phase.until - start))
        start = phase.until if phase.until is not None else start
    return count


# -- the windows -------------------------------------------------------------------------


def _advance(
    windows: list[Any], width: int, plan: MixturePlan, position: int
) -> tuple[list[Any], int]:
    """``windows`` (of ``width`` steps) brought to ``position``: those past it dropped (a
    rollback), pairs merged while more than the cap would be finished, the finished ones
    not yet counted counted with ``plan``."""
    windows = windows[: position // width]
    while position // width > MAX_MIXTURE_WINDOWS:
        windows = [_merge(windows[i], windows[i + 1]) for i in range(0, len(windows) - 1, 2)]
        width *= 2
    for i in range(len(windows), position // width):
        lo, hi = i * width, (i + 1) * width
        windows.append([plan.counts(lo, hi), plan.planned(lo, hi)])
    return windows, width


def _merge(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
    samples = [x + y for x, y in zip(a[0], b[0], strict=True)]
    planned = [round((x + y) / 2, 6) for x, y in zip(a[1], b[1], strict=True)]
    return [samples, planned]


def _sources(session: Session, run_id: int) -> list[tuple[RunSourceRow, int, object]]:
    rows = session.execute(
        select(RunSourceRow, VersionRow.total_samples, VersionRow.columns)
        .outerjoin(VersionRow, VersionRow.id == RunSourceRow.version_id)
        .where(RunSourceRow.run_id == run_id)
        .order_by(RunSourceRow.position)
    ).all()
    return [(src, int(samples or 0), columns) for src, samples, columns in rows]


def _plan_of(
    plan: Mapping[str, Any], sources: Sequence[tuple[RunSourceRow, int, object]]
) -> MixturePlan | None:
    sized = [(src, samples) for src, samples, _ in sources]
    return MixturePlan.of(plan, len(sources), epoch_samples(dict(plan), sized))


def _is_scheduled(plan: Mapping[str, Any]) -> bool:
    return stored_plan_params(plan).get("schedule") is not None


def record(
    session: Session, run_id: int, epoch: int, sample_in_epoch: int, plan: Mapping[str, Any]
) -> None:
    """Count the windows a new checkpoint (at ``epoch``, ``sample_in_epoch``, with
    ``plan``) finished; nothing for a plan without a schedule (one query for those)."""
    if not _is_scheduled(plan):
        return
    mixture = _plan_of(plan, _sources(session, run_id))
    if mixture is None:
        return
    position = mixture.position(epoch, sample_in_epoch)
    if position > MAX_STEPS:  # versions claiming huge epochs: beyond what any store holds
        raise RequestValidationError(
            f"epoch {epoch:,} at {mixture.num_batches:,} global steps an epoch is global "
            f"step {position:,}, beyond the bound on steps: at most {MAX_STEPS:,}",
            422,
        )
    row = session.get(RunMixtureRow, run_id)
    if row is None:
        row = RunMixtureRow(run_id=run_id, width=1, windows=[], updated_at=utcnow())
        session.add(row)
    stored = [w for w in row.windows if _fits(w, mixture)]
    if len(stored) != len(row.windows):
        stored = []  # not this run's shape (cannot happen through the API): count afresh
    windows, width = _advance(stored, row.width, mixture, position)
    if (windows, width) != (row.windows, row.width):
        row.windows, row.width, row.updated_at = windows, width, utcnow()


def _fits(window: object, plan: MixturePlan) -> bool:
    n = plan.schedule.num_sources
    return (
        isinstance(window, list)
        and len(window) == 2
        and all(isinstance(part, list) and len(part) == n for part in window)
    )


def for_run(session: Session, run_id: int) -> RunMixtureHistory:
    """The run's mixture over training, up to its latest checkpoint (see the module)."""
    run = runs_data.get(session, run_id)
    sources = _sources(session, run_id)
    names = [f"{src.dataset} v{src.version}" for src, _, _ in sources]
    per_sample = [tokens_per_sample(columns) for _, _, columns in sources]
    latest = session.scalars(
        select(CheckpointRow)
        .where(CheckpointRow.run_id == run_id, CheckpointRow.superseded_by.is_(None))
        .order_by(CheckpointRow.step.desc())
        .limit(1)
    ).first()
    mixture = _plan_of(latest.plan if latest is not None else run.plan, sources)
    history = RunMixtureHistory(
        run_id=run_id, sources=names, scheduled=mixture is not None, tokens_per_sample=per_sample
    )
    if mixture is None:
        return history
    ends = mixture.phase_ends()
    history = history.model_copy(
        update={
            "phase_ends": [step for step, _ in ends],
            "tokens_per_step": mixture.tokens_per_step,
            "phase_end_tokens": [t for _, t in ends if t is not None],
        }
    )
    if latest is None:
        return history
    position = mixture.position(latest.epoch, latest.sample_in_epoch)
    row = session.get(RunMixtureRow, run_id)
    stored = list(row.windows) if row is not None else []
    if not all(_fits(w, mixture) for w in stored):
        stored = []
    windows, width = _advance(stored, row.width if row is not None else 1, mixture, position)
    known = None if None in per_sample else [int(n or 0) for n in per_sample]
    out = [
        _window(i * width, (i + 1) * width, samples, planned, known)
        for i, (samples, planned) in enumerate(windows)
    ]
    through = len(windows) * width
    if through < position:  # the window the run is in, up to its latest checkpoint
        counted = mixture.counts(through, position)
        out.append(
            _window(
                through, position, counted, mixture.planned(through, position), known, open_=True
            )
        )
    return history.model_copy(update={"step": position, "window_steps": width, "windows": out})


def _window(
    start: int,
    stop: int,
    samples: list[int],
    planned: list[float],
    per_sample: list[int] | None,
    *,
    open_: bool = False,
) -> MixtureWindow:
    tokens = (
        None if per_sample is None else [c * t for c, t in zip(samples, per_sample, strict=True)]
    )
    return MixtureWindow(
        start=start, stop=stop, samples=samples, tokens=tokens, planned=planned, open=open_
    )
