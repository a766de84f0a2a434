"""The resume state of a plan: a few integers and a fingerprint, applied in O(1).

A position is *global batches consumed* in an epoch. It means the same thing for every
world size and worker count (ranks and workers only choose which slice of a global batch
they read), so a state written by 64 ranks resumes on 16. ``samples`` is derived
(``batches * global_batch_size``) and counts padded positions when ``tail="pad"``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shardstream.client.plan._config import PlanConfig, SourceSpec
from shardstream.errors import ResumeError


def plan_fingerprint(algorithm: int, config: PlanConfig, sources: Sequence[SourceSpec]) -> str:
    """sha256 (first 32 hex digits) of the algorithm version, the config, and every
    source's name/version, mixture setting and shard sizes."""
    h = hashlib.sha256(f"{algorithm}:{config!r}".encode())
    for s in sources:
        h.update(repr((s.name, s.weight, s.repeat, s.count)).encode())
        h.update(np.ascontiguousarray(s.shard_sizes, dtype="<i8").tobytes())
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class PlanState:
    """Where a run is: ``epoch``, global ``batches`` consumed in it, and the plan it used.

    ``fingerprint`` is :attr:`EpochPlan.fingerprint` (sources, versions, plan parameters);
    ``global_batch_size`` is kept for readers that want ``samples``.
    """

    epoch: int
    batches: int
    global_batch_size: int
    fingerprint: str

    @property
    def samples(self) -> int:
        """Sample positions consumed in ``epoch`` (``batches * global_batch_size``)."""
        return self.batches * self.global_batch_size

    def start_batch(self, fingerprint: str, epoch: int, num_batches: int) -> int:
        """The batch to resume at in a plan with this ``fingerprint`` and ``epoch``."""
        if self.fingerprint != fingerprint:
            raise ResumeError(
                f"resume state was made with a different plan (fingerprint "
                f"{self.fingerprint} != {fingerprint}): sources, versions, weights, "
                f"seed, global_batch_size, num_partitions, shuffle, tail, window and "
                f"epoch_size must all match the interrupted run"
            )
        if self.epoch != epoch:
            raise ResumeError(f"resume state is for epoch {self.epoch}, plan is {epoch}")
        if self.batches > num_batches:
            raise ResumeError(
                f"resume state is at batch {self.batches}, past the epoch's {num_batches} batches"
            )
        return self.batches

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``state_dict`` payload)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanState:
        """Parse :meth:`to_dict` output; :class:`ResumeError` names a missing/bad field."""
        try:
            state = cls(
                epoch=int(data["epoch"]),
                batches=int(data["batches"]),
                global_batch_size=int(data["global_batch_size"]),
                fingerprint=str(data["fingerprint"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(
                f"plan state {data!r} is not valid: needs integer epoch, batches, "
                f"global_batch_size and a fingerprint ({exc})"
            ) from exc
        if state.epoch < 0 or state.batches < 0 or state.global_batch_size < 1:
            raise ResumeError(f"plan state {data!r} has negative or zero fields")
        return state
