"""The audit of a run: from the ledger and a recomputed plan, did its effective history
consume every global batch of each epoch exactly once, in the plan's order?

The *effective history* is the chain of attempts the final state descends from: the live
checkpoints (those no rollback abandoned) by step, each committed by an attempt that
resumed from the previous one's checkpoint. Checked, per pair of consecutive checkpoints:

* the chain: where the committing attempt changes, the new attempt resumed from exactly
  the previous checkpoint (step and committing attempt), so no commit of an abandoned
  or unrelated start is in the history;
* positions: the global position (samples since the run's start, through the epoch sizes
  recomputed here with :mod:`shardstream.plan` from the server's shard index, not
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
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.server.models import CheckpointRow, RunAttemptRow

from . import attempts as attempts_data
from . import runs as runs_data
from .audit_plans import PlanFacts, order_differences, plan_facts

MAX_FINDINGS = 50
"""Failures listed in full (the count is always exact)."""

PAGE = 10_000
"""Checkpoints read per query."""

MAX_ROWS = 1_000
"""Epochs and history segments listed (``epoch_count`` and ``history_count`` are exact)."""

MAX_TEXT = 1_000
"""Characters of one failure at most (a hostile plan's values are cut, not echoed)."""

DEADLINE_S = 60.0
"""Seconds an audit reads for before it answers "cannot be proven within the bound"."""


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
    params: Any


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
                plan["plan"].as_string(),
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


def audit(session: Session, run_id: int, *, deadline_s: float = DEADLINE_S) -> dict[str, Any]:
    """The audit report of run ``run_id`` (see the module); ``verdict`` is the answer,
    ``ok`` says nothing was found wrong. Stops reading after ``deadline_s`` seconds (the
    verdict is then "cannot be proven")."""
    started = time.monotonic()
    run = runs_data.get(session, run_id)
    run_versions = [f"{s.dataset}@{s.version}" for s in runs_data.sources(session, run_id)]
    run_tuple = tuple(run_versions)
    attempts = {a.number: a for a in attempts_data.all_of(session, run_id)}
    failures: list[str] = []
    failure_count = 0
    unproven: list[str] = []  # why the history cannot be proven, where nothing failed

    def fail(message: str) -> None:
        nonlocal failure_count
        failure_count += 1
        if len(failures) < MAX_FINDINGS:
            failures.append(_clip(message))

    def cannot(message: str) -> None:
        if len(unproven) < MAX_FINDINGS and _clip(message) not in unproven:
            unproven.append(_clip(message))

    known: dict[tuple[Any, Any], PlanFacts] = {}

    def facts_of(point: _Point) -> PlanFacts:
        key = (point.params, point.versions)
        facts = known.get(key)
        if facts is None:
            facts = plan_facts(session, _value(point.params), _versions_of(point.versions))
            if len(known) < 1024:
                known[key] = facts
        return facts

    def flat(point: _Point, facts: PlanFacts) -> int | None:
        """The global position of ``point`` in the plan ``facts`` (one epoch size per plan:
        O(1) at any epoch)."""
        return None if facts.size is None else point.epoch * facts.size + point.sample

    rates: Counter[int] = Counter()
    epochs: dict[int, dict[str, Any]] = {}
    epoch_count = 0
    history: list[dict[str, Any]] = []  # one segment per attempt along the chain
    history_count = 0
    segment_attempt: int | None = None
    prev: _Point | None = None
    last_facts: PlanFacts | None = None
    first: tuple[RunAttemptRow, _Point, int | None] | None = None
    commits = 0
    stopped: int | None = None
    pending_rate_checks: list[tuple[_Point, _Point, int]] = []

    for point in _points(session, run_id):
        if commits % 256 == 0 and time.monotonic() - started > deadline_s:
            stopped = point.step
            break
        commits += 1
        facts = facts_of(point)
        attempt = attempts.get(point.attempt) if point.attempt is not None else None
        if point.attempt is None:
            fail(
                f"step {point.step} was committed without an attempt (a client from before "
                "the ledger): which start of the job consumed it cannot be proven"
            )
        elif attempt is None:
            fail(f"step {point.step} names attempt {point.attempt}, which is not registered")
        swapped = _versions_of(point.versions) != run_tuple
        if swapped and "versions" not in _accepted(attempt):
            fail(
                f"step {point.step} was read from {_versions(point)}, but run {run_id} reads "
                f"{run_versions}: a dataset version was swapped under the run"
            )
        if facts.size is None:
            if not swapped:  # a swapped version says it all; its sizes are not the point
                cannot(f"step {point.step}: {facts.why}: positions cannot be checked")
        elif facts.batch is not None and point.sample % facts.batch:
            fail(
                f"step {point.step} is at sample {point.sample:,} of epoch {point.epoch:,}, "
                f"not at the end of a global batch of {facts.batch}"
            )
        elif point.sample > facts.size:
            fail(
                f"step {point.step} is at sample {point.sample:,} of epoch {point.epoch:,}, "
                f"which has {facts.size:,}"
            )
        if history_count == 0 or segment_attempt != point.attempt:
            segment_attempt = point.attempt
            history_count += 1
            if len(history) < MAX_ROWS:
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
                first = (attempt, point, flat(point, facts))
        if history_count <= MAX_ROWS:
            history[-1]["last_step"] = point.step
        where = flat(point, facts)
        if prev is not None:
            changed = order_differences(_identity(prev), _identity(point))
            if changed:
                _check_order(prev, point, attempt, attempts=attempts, changed=changed, fail=fail)
            before = flat(prev, facts)  # read in the plan in force from here on
            if where is not None and before is not None:
                advanced = where - before
                steps = point.step - prev.step
                if advanced < 0:
                    fail(
                        f"steps {prev.step} -> {point.step}: the position went back "
                        f"{-advanced:,} samples (batches read twice in the history)"
                    )
                else:
                    if advanced % steps == 0:
                        rates[advanced // steps] += steps
                    if len(pending_rate_checks) < 1_000_000:
                        pending_rate_checks.append((prev, point, advanced))
        if point.epoch not in epochs:
            epoch_count += 1
            if len(epochs) < MAX_ROWS:
                epochs[point.epoch] = {
                    "epoch": point.epoch,
                    "samples": facts.size,
                    "consumed_to": 0,
                }
        if point.epoch in epochs:
            info = epochs[point.epoch]
            info["consumed_to"] = max(info["consumed_to"], point.sample)
        prev, last_facts = point, facts

    rate = rates.most_common(1)[0][0] if rates else None
    if rate is not None and rate % run.global_batch_size:
        fail(
            f"the run consumes {rate:,} samples per step, not a whole number of its global "
            f"batches of {run.global_batch_size:,}: positions are off the plan's batches"
        )
    for before_point, after, got in pending_rate_checks:
        expected = (rate or 0) * (after.step - before_point.step)
        if got != expected:
            who = (
                ""
                if before_point.attempt == after.attempt
                else f" (attempt {after.attempt} resumed)"
            )
            fail(
                f"steps {before_point.step} -> {after.step}{who}: the data advanced {got:,} "
                f"samples where the run's {rate} per step make {expected:,}: "
                + ("batches skipped" if got > expected else "batches read again")
                + " against the model's steps (a model step restored without its loader "
                "state?)"
            )
    if first is not None and rate is not None:
        start_attempt, start, where = first
        if where is not None and where != start.step * rate:
            fail(
                f"the history starts at step {start.step} (attempt {start_attempt.number}, "
                f"from the start of the data) at sample {where:,}, but {start.step} steps of "
                f"{rate} samples are {start.step * rate:,}: "
                + (
                    "batches before it were skipped"
                    if where > start.step * rate
                    else "its first steps read no data, or steps are counted from another origin"
                )
            )
    _finish_epochs(epochs, prev)
    if stopped is not None:
        cannot(
            f"the audit stopped at step {stopped} after {deadline_s:g} s ({commits:,} "
            "checkpoints read): the history cannot be proven within the bound; "
            "`shardstream runs audit` has the longest bound"
        )
    where_now = _where(prev, last_facts)
    if run.status == "completed" and prev is not None and stopped is None:
        size = last_facts.size if last_facts is not None else None
        if size is not None and not (prev.sample in (0, size) and (prev.epoch or prev.sample)):
            fail(
                f"run {run_id} is marked completed, but its history ends inside an epoch "
                f"({where_now}): the rest of the epoch was never consumed"
            )
    _check_refused_models(attempts, fail)
    if commits == 0 and stopped is None:
        fail(f"run {run_id} has no checkpoints: there is no history to prove")
    changes = [
        {"attempt": a.number, **change}
        for a in attempts.values()
        for change in (a.changes or [])[_inherited(a, attempts) :]
    ]
    verdict, text = _verdict(failure_count, unproven, run.status, where_now)
    return {
        "run": run_id,
        "verdict": verdict,
        "verdict_text": text,
        "ok": failure_count == 0 and not unproven,
        "failures": failures,
        "failure_count": failure_count,
        "unproven": unproven,
        "checkpoints": commits,
        "latest_step": run.latest_step,
        "status": run.status,
        "samples_per_step": rate,
        "epochs": [epochs[e] for e in sorted(epochs)],
        "epoch_count": epoch_count,
        "history": history,
        "history_count": history_count,
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


def _check_order(
    prev: _Point,
    point: _Point,
    attempt: RunAttemptRow | None,
    *,
    attempts: dict[int, RunAttemptRow],
    changed: dict[str, tuple[Any, Any]],
    fail: Any,
) -> None:
    """The order stays the same unless the attempt that changed it recorded the change
    itself (at its own resume, not inherited from the attempt it resumed), and the change
    it recorded is the one its checkpoints show (the new value of each field)."""
    resumed = prev.attempt != point.attempt and attempt is not None
    own = _own_changes(attempt, attempts) if resumed and attempt is not None else {}
    for name, (old, new) in changed.items():
        recorded = own.get(name)
        what = (
            f"steps {prev.step} -> {point.step}: the order's {name} changed "
            f"({_short(old)} -> {_short(new)})"
        )
        if recorded is None:
            fail(
                f"{what} without a change accepted at a resume (allow_changes)"
                + (
                    f": attempt {point.attempt} recorded none of its own"
                    if resumed and not own
                    else ""
                )
            )
        elif recorded != new:
            fail(
                f"{what}, but attempt {point.attempt} recorded {name} -> {_short(recorded)}: "
                "the recorded change does not explain the order it read"
            )


def _own_changes(attempt: RunAttemptRow, attempts: dict[int, RunAttemptRow]) -> dict[str, Any]:
    """``{name: new value}`` of the changes ``attempt`` recorded itself."""
    out: dict[str, Any] = {}
    for change in (attempt.changes or [])[_inherited(attempt, attempts) :]:
        if isinstance(change, dict) and isinstance(change.get("changed"), dict):
            for name, values in change["changed"].items():
                pair = isinstance(values, list) and len(values) == 2
                out[str(name)] = values[1] if pair else values
    return out


def _identity(point: _Point) -> tuple[Any, Any, Any, Any]:
    """What decides a checkpoint's order, decoded: algorithm, fingerprint, versions, plan."""
    return (
        _value(point.algorithm),
        _value(point.fingerprint),
        list(_versions_of(point.versions)),
        _value(point.params),
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _clip(message: str) -> str:
    return message if len(message) <= MAX_TEXT else message[: MAX_TEXT - 3] + "..."


def _where(last: _Point | None, facts: PlanFacts | None) -> str:
    """Where the history ends: ``"epoch 0 at 720 of 2,400"``."""
    if last is None:
        return "no checkpoint"
    size = "?" if facts is None or facts.size is None else f"{facts.size:,}"
    return f"epoch {last.epoch:,} at {last.sample:,} of {size}"


def _verdict(failures: int, unproven: list[str], status: str, where: str) -> tuple[str, str]:
    """The verdict and its line: proven (a completed run), proven so far (a run not marked
    completed: nothing wrong up to its latest checkpoint), not proven, cannot be proven."""
    if failures:
        return "not_proven", "NOT PROVEN"
    if unproven:
        return "cannot_prove", "CANNOT BE PROVEN"
    if status == "completed":
        return "proven", f"PROVEN, ended at {where}"
    return "proven_so_far", f"PROVEN so far ({status}), {where}"


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
