"""The resume state of a plan: a few integers and a fingerprint, applied in O(1).

A position is *global batches consumed* in an epoch. It means the same thing for every
world size and worker count (ranks and workers only choose which slice of a global batch
they read), so a state written by 64 ranks resumes on 16. ``samples`` is derived
(``batches * global_batch_size``) and counts padded positions when ``tail="pad"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from shardstream.errors import ResumeError


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
