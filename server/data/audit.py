"""The audit of a run: from the ledger and a recomputed plan, did its effective history
consume every global batch of each epoch exactly once, in the plan's order?

The *effective history* is the chain of attempts the final state descends from: the live
checkpoints (those no rollback abandoned) by step, each committed by an attempt that
resumed from the previous one's checkpoint. Checked, per pair of consecutive checkpoints:

* the chain: where the committing attempt changes, the new attempt resumed from exactly
  the previous checkpoint (step and committing attempt), so no commit of an abandoned
  or unrelated start is in the history;
* positions: the global position (samples since the run's start, through the epoch sizes
  recomputed here with :mod:`shardstream.client.plan` from the server's shard index, not
  taken from the client) advances by the same number of samples per training step
  everywhere (the run's *rate*): a gap is a skipped batch, a step back a batch read
  twice, and a jump at a resume a model step that does not match the loader's position;
* the order: the algorithm version and plan fingerprint stay the same unless the
  attempt that changes them recorded the change (``allow_changes``), and the versions
  read are the run's.

Positions are counted in whole global batches of the plan's order, so "contiguous and
consistent with the steps" is "each batch of the history exactly once, in order". The
report lists the attempts (topology, resume point, rollbacks, discarded steps), the plan
changes, and per epoch the batches the history consumed of the batches it has.

Cost: one pass over the run's checkpoints (four integers and three short texts per row,
a page at a time; the texts compared as fetched and decoded once per distinct value), plus
one plan per epoch touched (O(shards)): about 2 s of CPU for 100,000 checkpoints
(benchmarks/ledger.py).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.server.models import CheckpointRow, DatasetRow, RunAttemptRow, ShardRow, VersionRow

from . import attempts as attempts_data
from . import runs as runs_data

MAX_FINDINGS = 50
"""Failures listed in full (the count is always exact)."""

PAGE = 10_000
"""Checkpoints read per query."""

MAX_EPOCHS = 10_000
"""Epochs whose size is recomputed for one audit."""


@dataclass(frozen=True)
class _Point:
    """One checkpoint; ``algorithm``, ``fingerprint`` and ``versions`` as the database
    hands out the JSON values' text (compared as they are; see :func:`_value`)."""

    step: int
    epoch: int
    sample: int
    attempt: int | None
    algorithm: Any
    fingerprint: Any
    versions: Any


@functools.lru_cache(maxsize=1024)
def _value(raw: Any) -> Any:
    """A JSON value fetched as text (no decoding per row: a run's rows repeat a handful of
    values), decoded once per distinct text; SQLite hands numbers back as numbers."""
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # a plain string (``->>`` and json_extract unquote strings)


class _Sizes:
    """Samples consumed per epoch (whole global batches), recomputed from the plan."""

    def __init__(self, session: Session, plan: dict[str, Any], versions: list[str]) -> None:
        self.error: str | None = None
        self._cache: dict[int, int] = {}
        self._plan: Any = None
        try:
            self._plan = _plan_factory(session, plan, versions)
            first = self._plan(0)  # parameters that cannot make a plan fail here, reported
            self._cache[0] = int(first.num_batches) * int(first.config.global_batch_size)
        except Exception as exc:  # reported, not raised: the audit then cannot prove sizes
            self.error = f"the plan cannot be recomputed on the server: {exc}"
            self._plan = None

    def size(self, epoch: int) -> int | None:
        if self._plan is None or len(self._cache) >= MAX_EPOCHS:
            return None
        if epoch not in self._cache:
            try:
                plan = self._plan(epoch)
            except ValueError as exc:  # PlanError: parameters that cannot make a plan
                self.error, self._plan = f"the plan cannot be recomputed on the server: {exc}", None
                return None
            self._cache[epoch] = int(plan.num_batches) * int(plan.config.global_batch_size)
        return self._cache[epoch]


def _plan_factory(session: Session, params: dict[str, Any], versions: list[str]) -> Any:
    """``epoch -> EpochPlan`` for a state's plan parameters over the server's shard sizes."""
    from shardstream.client.plan import MixtureSchedule, PlanConfig, SourceSpec, make_plan

    fields = ("seed", "global_batch_size", "num_partitions", "shuffle", "tail", "window")
    config = PlanConfig(
        **{k: params[k] for k in fields if k in params}, epoch_size=params.get("epoch_size")
    )
    mixture = params.get("mixture") or [[None, None, None]] * len(versions)
    if len(mixture) != len(versions):
        raise ValueError(f"{len(versions)} versions but {len(mixture)} mixture entries")
    specs = []
    for version, (weight, repeat, count) in zip(versions, mixture, strict=True):
        name, _, number = str(version).rpartition("@")
        vid = session.scalar(
            select(VersionRow.id)
            .join(DatasetRow, DatasetRow.id == VersionRow.dataset_id)
            .where(DatasetRow.name == name, VersionRow.number == int(number.lstrip("v")))
        )
        if vid is None:
            raise ValueError(f"version {version} is not on this server (deleted?)")
        sizes = session.scalars(
            select(ShardRow.samples).where(ShardRow.version_id == vid).order_by(ShardRow.idx)
        ).all()
        specs.append(
            SourceSpec(
                shard_sizes=np.array(sizes, dtype=np.int64),
                weight=weight,
                repeat=repeat,
                count=count,
                name=str(version),
            )
        )
    schedule = MixtureSchedule.from_params(params.get("schedule"))
    return lambda epoch: make_plan(specs, config, epoch, schedule)


def _points(session: Session, run_id: int) -> Iterator[_Point]:
    """The live checkpoints by step, a page of :data:`PAGE` rows at a time (keyset: no
    server-side cursor, which a read session in autocommit mode cannot hold)."""
    plan = CheckpointRow.plan
    after = -1
    connection = session.connection()  # Core rows: the ORM's per-row work is half the cost
    while True:
        rows = connection.execute(
            select(
                CheckpointRow.step,
                CheckpointRow.epoch,
                CheckpointRow.sample_in_epoch,
                CheckpointRow.attempt,
                plan["algorithm"].as_string(),
                plan["fingerprint"].as_string(),
                plan["versions"].as_string(),
            )
            .where(
                CheckpointRow.run_id == run_id,
                CheckpointRow.superseded_by.is_(None),
                CheckpointRow.step > after,
            )
            .order_by(CheckpointRow.step)
            .limit(PAGE)
        ).all()
        for row in rows:
            yield _Point(*row)
        if len(rows) < PAGE:
            return
        after = rows[-1][0]


def _attempt_public(row: RunAttemptRow) -> dict[str, Any]:
    out = attempts_data.to_public(row).model_dump(mode="json")
    out.pop("run_id", None)
    out["discarded_steps"] = (
        None
        if row.rolled_back_from is None or row.resumed_step is None
        else row.rolled_back_from - row.resumed_step
    )
    return out


def audit(session: Session, run_id: int) -> dict[str, Any]:
    """The audit report of run ``run_id`` (see the module); ``ok`` is the verdict."""
    run = runs_data.get(session, run_id)
    run_versions = [f"{s.dataset}@{s.version}" for s in runs_data.sources(session, run_id)]
    run_tuple = tuple(run_versions)
    attempts = {a.number: a for a in attempts_data.all_of(session, run_id)}
    failures: list[str] = []
    failure_count = 0

    def fail(message: str) -> None:
        nonlocal failure_count
        failure_count += 1
        if len(failures) < MAX_FINDINGS:
            failures.append(message)

    sizes: _Sizes | None = None
    rates: Counter[int] = Counter()
    epochs: dict[int, dict[str, Any]] = {}
    history: list[dict[str, Any]] = []  # one segment per attempt along the chain
    prev: _Point | None = None
    prev_flat: int | None = 0
    first: tuple[RunAttemptRow, _Point] | None = None
    flat_base: dict[int, int] = {0: 0}  # epoch -> global position of its first sample
    commits = 0
    pending_rate_checks: list[tuple[_Point, _Point, int]] = []

    def flat(point: _Point) -> int | None:
        assert sizes is not None
        if point.epoch not in flat_base:
            known = max(e for e in flat_base if e < point.epoch)
            for e in range(known, point.epoch):
                size = sizes.size(e)
                if size is None:
                    return None
                flat_base[e + 1] = flat_base[e] + size
        return flat_base[point.epoch] + point.sample

    for point in _points(session, run_id):
        commits += 1
        if sizes is None:
            sizes = _Sizes(session, _plan_of(session, run_id, point.step), _versions(point))
            if sizes.error:
                fail(sizes.error)
        attempt = attempts.get(point.attempt) if point.attempt is not None else None
        if point.attempt is None:
            fail(
                f"step {point.step} was committed without an attempt (a client from before "
                "the ledger): which start of the job consumed it cannot be proven"
            )
        elif attempt is None:
            fail(f"step {point.step} names attempt {point.attempt}, which is not registered")
        if _versions_of(point.versions) != run_tuple and "versions" not in _accepted(attempt):
            fail(
                f"step {point.step} was read from {_versions(point)}, but run {run_id} reads "
                f"{run_versions}: a dataset version was swapped under the run"
            )
        size = sizes.size(point.epoch) if sizes else None
        if size is not None and point.sample > size:
            fail(
                f"step {point.step} is at sample {point.sample} of epoch {point.epoch}, "
                f"which has {size}"
            )
        if not history or history[-1]["attempt"] != point.attempt:
            history.append(
                {
                    "attempt": point.attempt,
                    "from_step": None if prev is None else prev.step,
                    "first_step": point.step,
                    "last_step": point.step,
                }
            )
            _check_link(prev, point, attempt, fail)
            if prev is None and attempt is not None and attempt.resumed_step is None:
                first = (attempt, point)
        history[-1]["last_step"] = point.step
        where = flat(point)
        if prev is not None:
            if (prev.algorithm, prev.fingerprint, prev.versions) != (
                point.algorithm,
                point.fingerprint,
                point.versions,
            ):
                _check_order(prev, point, attempt, fail)
            if where is not None and prev_flat is not None:
                advanced = where - prev_flat
                steps = point.step - prev.step
                if advanced < 0:
                    fail(
                        f"steps {prev.step} -> {point.step}: the position went back "
                        f"{-advanced} samples (batches read twice in the history)"
                    )
                else:
                    if advanced % steps == 0:
                        rates[advanced // steps] += steps
                    pending_rate_checks.append((prev, point, advanced))
        epoch_info = epochs.setdefault(
            point.epoch, {"epoch": point.epoch, "samples": size, "consumed_to": 0}
        )
        epoch_info["consumed_to"] = max(epoch_info["consumed_to"], point.sample)
        prev, prev_flat = point, where

    rate = rates.most_common(1)[0][0] if rates else None
    for before, after, got in pending_rate_checks:
        expected = (rate or 0) * (after.step - before.step)
        if got != expected:
            who = "" if before.attempt == after.attempt else f" (attempt {after.attempt} resumed)"
            fail(
                f"steps {before.step} -> {after.step}{who}: the data advanced {got} samples "
                f"where the run's {rate} per step make {expected}: "
                + ("batches skipped" if got > expected else "batches read again")
                + " against the model's steps (a model step restored without its loader "
                "state?)"
            )
    if first is not None and rate is not None and sizes is not None:
        start_attempt, start = first
        where = flat(start)
        if where is not None and where != start.step * rate:
            fail(
                f"the history starts at step {start.step} (attempt {start_attempt.number}, "
                f"from the start of the data) at sample {where}, but {start.step} steps of "
                f"{rate} samples are {start.step * rate}: "
                + (
                    "batches before it were skipped"
                    if where > start.step * rate
                    else "its first steps read no data, or steps are counted from another origin"
                )
            )
    _finish_epochs(epochs, prev)
    _check_refused_models(attempts, fail)
    if commits == 0:
        fail(f"run {run_id} has no checkpoints: there is no history to prove")
    changes = [
        {"attempt": a.number, **change}
        for a in attempts.values()
        for change in (a.changes or [])[_inherited(a, attempts) :]
    ]
    return {
        "run": run_id,
        "ok": failure_count == 0,
        "failures": failures,
        "failure_count": failure_count,
        "checkpoints": commits,
        "latest_step": run.latest_step,
        "samples_per_step": rate,
        "epochs": [epochs[e] for e in sorted(epochs)],
        "history": history,
        "attempts": [_attempt_public(a) for a in attempts.values()],
        "rollbacks": [
            {
                "attempt": a.number,
                "from_step": a.rolled_back_from,
                "to_step": a.resumed_step,
            }
            for a in attempts.values()
            if a.rolled_back_from is not None
        ],
        "plan_changes": changes,
    }


def _check_refused_models(attempts: dict[int, RunAttemptRow], fail: Any) -> None:
    """A start that resumed from a step an earlier start trained to but whose commit
    there was refused: that start's trainer may have saved its model of the step before
    the refusal (trained on other data than the checkpoint's history), and the restart
    may have loaded it. The ledger cannot tell which model it loaded: not proven."""
    refused: dict[int, list[int]] = {}  # step -> attempts whose commit of it was refused
    for attempt in attempts.values():  # in order of registration
        step = attempt.resumed_step
        if step is not None:
            for earlier in refused.get(step, []):
                fail(
                    f"attempt {attempt.number} resumed from step {step}, which attempt "
                    f"{earlier} also trained to, but the server refused attempt {earlier}'s "
                    f"commit of it: its model of step {step} may be the one attempt "
                    f"{attempt.number} restored (trained on other data than checkpoint "
                    f"{step}'s); resume from a step whose model is known to be right"
                )
        for point in attempt.refused or []:
            refused.setdefault(int(point[0]), []).append(attempt.number)


def _versions(point: _Point) -> list[str]:
    return list(_versions_of(point.versions))


@functools.lru_cache(maxsize=1024)
def _versions_of(raw: Any) -> tuple[str, ...]:
    value = _value(raw)
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _plan_of(session: Session, run_id: int, step: int) -> dict[str, Any]:
    row = session.get(CheckpointRow, (run_id, step))
    plan = row.plan.get("plan") if row is not None else None
    return dict(plan) if isinstance(plan, dict) else {}


def _inherited(attempt: RunAttemptRow, attempts: dict[int, RunAttemptRow]) -> int:
    """How many of ``attempt``'s changes it inherited from the attempt it resumed."""
    parent = attempts.get(attempt.resumed_attempt) if attempt.resumed_attempt else None
    return len(parent.changes or []) if parent is not None else 0


def _check_link(
    prev: _Point | None, point: _Point, attempt: RunAttemptRow | None, fail: Any
) -> None:
    """A new attempt in the chain resumed from exactly the previous checkpoint."""
    if attempt is None:
        return
    if prev is None:
        if attempt.resumed_step is not None:
            fail(
                f"the history starts with attempt {attempt.number}, which resumed from step "
                f"{attempt.resumed_step}: the checkpoints before it are gone"
            )
        return
    if attempt.resumed_step != prev.step or attempt.resumed_attempt != prev.attempt:
        fail(
            f"attempt {attempt.number} commits step {point.step} after step {prev.step} of "
            f"attempt {prev.attempt}, but it resumed from step {attempt.resumed_step} of "
            f"attempt {attempt.resumed_attempt}: it does not continue this history"
        )


def _check_order(prev: _Point, point: _Point, attempt: RunAttemptRow | None, fail: Any) -> None:
    """The order stays the same unless the attempt that changed it recorded the change."""
    for name, old, new in (
        ("algorithm", prev.algorithm, point.algorithm),
        ("fingerprint", prev.fingerprint, point.fingerprint),
        ("versions", prev.versions, point.versions),
    ):
        if old == new:
            continue
        accepted = _accepted(attempt) if prev.attempt != point.attempt else set()
        # A changed parameter or version changes the fingerprint too.
        recorded = name in accepted or (name == "fingerprint" and bool(accepted))
        if not recorded:
            fail(
                f"steps {prev.step} -> {point.step}: the order's {name} changed "
                f"({_value(old)!r} -> {_value(new)!r}) without a change accepted at a resume "
                "(allow_changes)"
            )


def _accepted(attempt: RunAttemptRow | None) -> set[str]:
    """Names of everything a resume accepted to change, up to and including ``attempt``."""
    if attempt is None:
        return set()
    return {
        str(name)
        for change in attempt.changes or []
        if isinstance(change, dict) and isinstance(change.get("changed"), dict)
        for name in change["changed"]
    }


def _finish_epochs(epochs: dict[int, dict[str, Any]], last: _Point | None) -> None:
    for epoch, info in epochs.items():
        later = last is not None and last.epoch > epoch
        if later and info["samples"] is not None:
            info["consumed_to"] = info["samples"]  # the chain crossed its end contiguously
        info["complete"] = bool(later)
