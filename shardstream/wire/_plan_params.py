"""A run's plan parameters as they travel: the ``plan`` of a resume state.

The client writes them (every checkpoint commit and saved resume state carries them) and
the server reads them back to recompute what the client planned (epoch sizes, the audit,
the mixture figures), so both sides use this one type instead of an untyped dict. A
source's mixture setting travels as the positional list ``[weight, repeat, samples]``, what
every client has sent and every saved resume state holds; :class:`SourceMixture` gives
those fields names, so no reader indexes into the list. :meth:`PlanParams.to_wire` writes
exactly the dict clients always wrote (saved states keep matching).

>>> params = PlanParams(global_batch_size=8, mixture=[[0.5, None, None], {"samples": 10}])
>>> params.mixture[1].samples
10
>>> params.to_wire()["mixture"]
[[0.5, None, None], [None, None, 10]]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, field_validator

__all__ = ["PLAN_CONFIG_FIELDS", "PlanParams", "SourceMixture", "stored_plan_params"]

PLAN_CONFIG_FIELDS = (
    "seed",
    "global_batch_size",
    "num_partitions",
    "shuffle",
    "tail",
    "window",
    "epoch_size",
)
"""The plan configuration's fields (``shardstream.plan.PlanConfig``), in the order a resume
state writes them."""

_MIXTURE_FIELDS = ("weight", "repeat", "samples")


class SourceMixture(NamedTuple):
    """One source's share of a mixture: a ``weight`` (proportion), a ``repeat`` (passes over
    the source per epoch) or an absolute number of ``samples``; None where unset. On the
    wire it is the list ``[weight, repeat, samples]``."""

    weight: int | float | None = None  # kept as sent: an int weight stays an int
    repeat: int | float | None = None
    samples: int | None = None

    @classmethod
    def parse(cls, value: object) -> SourceMixture:
        """``value`` as sent: the list ``[weight, repeat, samples]`` or a mapping of those
        names. The values are the plan's to check (``SourceSpec``); the shape is checked
        here, with a ValueError naming what was given."""
        if isinstance(value, list | tuple) and len(value) == len(_MIXTURE_FIELDS):
            return cls(*value)
        if isinstance(value, Mapping) and set(value) <= set(_MIXTURE_FIELDS):
            return cls(**{str(k): v for k, v in value.items()})
        raise ValueError(
            f"a source's mixture is [weight, repeat, samples] or a mapping of those names, "
            f"not {value!r:.200}"
        )

    @classmethod
    def read(cls, value: object) -> SourceMixture:
        """``value`` from a stored plan that may hold anything (older servers did not bound
        what a client sent): each field that is not a sensible number is None, and so is
        all of a value of another shape, so a page reading it never fails."""
        if isinstance(value, list):  # by position, as far as it goes (a stored list may be short)
            value = [*value[: len(_MIXTURE_FIELDS)], None, None, None][: len(_MIXTURE_FIELDS)]
        try:
            weight, repeat, samples = cls.parse(value)
        except (ValueError, TypeError):
            return cls()
        return cls(
            weight if _is_number(weight) else None,
            repeat if _is_number(repeat) else None,
            samples if _is_count(samples) else None,
        )

    def to_wire(self) -> list[Any]:
        """The positional list every client and saved resume state has always held."""
        return [self.weight, self.repeat, self.samples]


class PlanParams(BaseModel):
    """The parameters of a run's plan, as a resume state carries them in ``plan``: the plan
    configuration's fields (:data:`PLAN_CONFIG_FIELDS`), each source's :class:`SourceMixture`
    in the order of the sources, the mixture schedule (``MixtureSchedule.to_params()``)
    and the packing (``None``: absent, as without a schedule or packing). Fields it does not
    know are kept (``extra``) so a newer client's parameters pass through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    seed: int = 0
    global_batch_size: int
    num_partitions: int = 1
    shuffle: bool = True
    tail: Literal["drop", "pad"] = "drop"
    window: int | None = None
    epoch_size: int | None = None
    mixture: list[SourceMixture] = []
    schedule: list[dict[str, Any]] | dict[str, Any] | None = None
    pack: dict[str, Any] | None = None

    @field_validator("mixture", mode="before")
    @classmethod
    def _positional_or_named(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            return [SourceMixture.parse(entry) for entry in value]
        return value

    def to_wire(self) -> dict[str, Any]:
        """The JSON dict a resume state holds: the configuration in its order, ``mixture``
        as positional lists, ``schedule`` and ``pack`` only when set, then unknown fields."""
        out: dict[str, Any] = {name: getattr(self, name) for name in PLAN_CONFIG_FIELDS}
        out["mixture"] = [entry.to_wire() for entry in self.mixture]
        if self.schedule is not None:
            out["schedule"] = self.schedule
        if self.pack is not None:
            out["pack"] = self.pack
        out.update(self.model_extra or {})
        return out


def stored_plan_params(stored: Mapping[str, Any]) -> Mapping[str, Any]:
    """The plan parameters inside a stored checkpoint's ``plan`` (a resume state, whose own
    ``plan`` holds them), or ``stored`` itself where it holds them directly (older clients,
    hand-written commits)."""
    inner = stored.get("plan")
    return inner if isinstance(inner, Mapping) else stored


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
