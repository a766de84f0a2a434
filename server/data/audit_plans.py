"""What the audit needs of a checkpoint's stored plan: the samples an epoch consumes, the
global batch, and which order-defining fields differ between two plans.

The audit trusts nothing the client computed: epoch sizes come from the stored plan
parameters and the server's own version totals, and an order change is found by comparing
the stored parameters, algorithm and versions (the client's fingerprint string is
compared too, but a resume that changed the seed while carrying the old string is caught
by its parameters).

Bounded: an epoch's size is the same for every epoch of one plan (a mixture schedule moves
samples between sources, never the epoch's total), so it is computed once per distinct
plan in O(sources), without building a plan: a schedule is validated, never expanded into
its pieces (a linear phase of 2**40 steps costs what a constant one does), and a position
at epoch 2**40 is one multiplication.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from shardstream.server.models import DatasetRow, VersionRow
from shardstream.wire import PLAN_CONFIG_FIELDS, SourceMixture

__all__ = ["PlanFacts", "order_differences", "plan_facts"]

_VERSION = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]{0,127})@v?(?P<number>[0-9]{1,18})$")


@dataclass(frozen=True)
class PlanFacts:
    """``size``: samples one epoch consumes (whole global batches); ``batch``: the global
    batch; ``None`` with ``why`` when the server cannot compute them."""

    size: int | None
    batch: int | None
    why: str | None = None


def plan_facts(session: Session, params: object, versions: tuple[str, ...]) -> PlanFacts:
    """The facts of a stored plan (``params``: the state's ``plan`` field) over
    ``versions`` (the state's version ids); never raises."""
    if not isinstance(params, Mapping):
        return PlanFacts(None, None, "the checkpoint stores no plan parameters")
    batch = params.get("global_batch_size")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        return PlanFacts(None, None, f"the stored global batch size {batch!r} is not a count")
    totals = []
    for version in versions:
        match = _VERSION.match(version)
        number = int(match["number"]) if match else None
        total = (
            None
            if match is None
            else session.scalar(
                select(VersionRow.total_samples)
                .join(DatasetRow, DatasetRow.id == VersionRow.dataset_id)
                .where(DatasetRow.name == match["name"], VersionRow.number == number)
            )
        )
        if total is None:
            return PlanFacts(None, batch, f"version {version[:200]!r} is not on this server")
        totals.append(int(total))
    try:
        return PlanFacts(_epoch_size(params, totals, batch), batch)
    except (ValueError, TypeError, KeyError) as exc:  # PlanError is a ValueError
        return PlanFacts(None, batch, f"the plan cannot be recomputed on the server: {exc}")


def _epoch_size(params: Mapping[str, Any], totals: list[int], batch: int) -> int:
    """Samples one epoch consumes: ``num_batches x batch``, as the plan computes it."""
    from shardstream.plan import (
        MixtureSchedule,
        PlanConfig,
        SourceSpec,
        check_schedule,
        source_totals,
    )

    config = PlanConfig(**{k: params[k] for k in PLAN_CONFIG_FIELDS if k in params})
    mixture = params.get("mixture") or [[None, None, None]] * len(totals)
    if not isinstance(mixture, list) or len(mixture) != len(totals):
        raise ValueError(f"{len(totals)} versions but a mixture of {mixture!r:.200}")
    # One shard per source holding its total: sizes depend on the totals alone.
    specs = [
        SourceSpec(shard_sizes=np.array([total]), weight=m.weight, repeat=m.repeat, count=m.samples)
        for total, m in zip(totals, map(SourceMixture.parse, mixture), strict=True)
    ]
    schedule = MixtureSchedule.from_params(params.get("schedule"))
    if schedule is None:
        samples = sum(source_totals(specs, config))
    else:
        check_schedule(schedule, specs)
        samples = config.epoch_size or sum(totals)
    batches = samples // batch if config.tail == "drop" else -(-samples // batch)
    if batches < 1:
        raise ValueError(f"the epoch has {samples} samples, fewer than one global batch")
    return batches * batch


def order_differences(
    old: tuple[Any, Any, Any, Any], new: tuple[Any, Any, Any, Any]
) -> dict[str, tuple[Any, Any]]:
    """``{name: (old, new)}`` for each order-defining field two checkpoints differ in;
    each side is ``(algorithm, fingerprint, versions, plan parameters)`` decoded. Named as
    a resume state names them (``seed``, ``algorithm``, ``versions``...); ``fingerprint``
    only when nothing else differs (what a client records then)."""
    found: dict[str, tuple[Any, Any]] = {}
    if old[0] != new[0]:
        found["algorithm"] = (old[0], new[0])
    if old[2] != new[2]:
        found["versions"] = (old[2], new[2])
    a = old[3] if isinstance(old[3], Mapping) else {}
    b = new[3] if isinstance(new[3], Mapping) else {}
    for key in sorted(set(a) | set(b), key=str):
        if a.get(key) != b.get(key):
            found[str(key)] = (a.get(key), b.get(key))
    if not found and old[1] != new[1]:
        found["fingerprint"] = (old[1], new[1])
    return found
