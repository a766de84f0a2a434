"""A reader's resume: the one place that makes a resume state, applies one, and moves a
position past an epoch's end.

:class:`~shardstream.client.state.ReaderState` is the value (its format, parsing and the
check that names every difference); this module is what a reader does with it. Both front
ends (:class:`~shardstream.client.StreamingDataset` and
:class:`~shardstream.client.ShardstreamLoader`) and the server calls (``_server.py``) go
through one :class:`ReaderResume` per dataset, so there is one rule for each of:

* **applying a state** (:meth:`ReaderResume.accept`): the reader adopts the state's plan
  shape where the user left it unset (:func:`adopt_saved`) and its packing group, then the
  state is checked against what the reader now computes; accepted differences are recorded
  in every later state (``changes``);
* **making a state** (:meth:`ReaderResume.state`): the position plus the stream's plan
  parameters, versions, weights, algorithm and fingerprint;
* **the epoch rollover** (:meth:`ReaderResume.past_end`): a position at or past the end of
  its epoch is the start of the next one, so a state taken right after an epoch's last
  batch resumes at the next epoch rather than at an empty pass;
* **a pass's start** (:meth:`ReaderResume.start`): where a DataLoader worker begins after
  a loaded state (its own position, or the global one plus its offset).

The stream (:class:`~shardstream.client.batches.stream.BatchStream`) only plans and builds
batches: it is told the config to plan with (:meth:`BatchStream.adopt`), never a state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

from shardstream.client.batches.stream import BatchStream
from shardstream.client.state import ReaderState
from shardstream.errors import PlanError, ResumeError
from shardstream.plan import PLAN_ALGORITHM, PlanConfig

__all__ = ["ADOPTED", "ReaderResume", "adopt_saved"]

ADOPTED = ("num_partitions", "window")
"""Plan parameters a resumed reader takes from the state when its options leave them unset."""


def adopt_saved(
    config: PlanConfig, saved: Mapping[str, Any], fixed: Mapping[str, Any]
) -> PlanConfig:
    """``config`` with the saved ``num_partitions`` and ``window`` of a resume state, for
    each of them the user did not fix (``fixed[name] is None``).

    A fresh run's defaults (:func:`shardstream.plan.default_shape`) depend on its world
    size; adopting the saved ones keeps a run's order fixed by its first launch. States
    written before the window had a default of its own hold ``window: None`` (the plan's
    own default); adopting that resumes them on their original order.
    """
    changes: dict[str, Any] = {}
    for name in ADOPTED:
        if fixed.get(name) is None and name in saved and saved[name] != getattr(config, name):
            changes[name] = saved[name]
    return replace(config, **changes) if changes else config


class ReaderResume:
    """The resume state and position rules of one reader (its :class:`BatchStream`)."""

    def __init__(self, stream: BatchStream) -> None:
        self.stream = stream
        self.changes: tuple[Mapping[str, Any], ...] = ()
        """Order changes a resume accepted (``allow_changes``), carried by every state."""

    def state(self, epoch: int, batch: int, worker: tuple[int, int] | None = None) -> ReaderState:
        """The resume state at ``(epoch, batch)`` of this reader (see :class:`ReaderState`)."""
        stream = self.stream
        return ReaderState(
            epoch,
            batch,
            stream.plan_params(),
            stream.versions,
            stream.weights,
            worker,
            algorithm=PLAN_ALGORITHM,
            fingerprint=stream.fingerprint(),
            changes=self.changes,
        )

    def load(
        self,
        state_dict: Mapping[str, Any],
        allow_changes: Iterable[str] = (),
        *,
        stateful_loader: bool = False,
    ) -> ReaderState:
        """Parse ``state_dict`` and :meth:`accept` it. With ``stateful_loader``, a whole
        torchdata ``StatefulDataLoader.state_dict()`` is read too (its workers' positions
        merged into the global one: :meth:`ReaderState.from_stateful_loader`)."""
        if stateful_loader and "_snapshot" in state_dict:  # torchdata's loader state
            state = ReaderState.from_stateful_loader(state_dict)
        else:
            state = ReaderState.from_dict(state_dict)
        return self.accept(state, allow_changes)

    def accept(self, state: ReaderState, allow_changes: Iterable[str] = ()) -> ReaderState:
        """Check that ``state`` can resume this reader; adopt its partition count and window
        unless the user fixed them. :class:`ResumeError` names every difference that
        ``allow_changes`` does not accept; the state returned records the accepted ones,
        and so does every state this reader makes from now on (:meth:`state`)."""
        stream = self.stream
        try:
            config = adopt_saved(stream.config, state.plan, asdict(stream.options))
            config.check_world_size(stream.topology.world_size)
        except PlanError as exc:
            raise ResumeError(f"cannot resume with this world size: {exc}") from exc
        stream.adopt(config, state.plan.get("pack"))
        accepted = state.check_compatible(self.state(0, 0), allow_changes)
        self.changes = accepted.changes
        return accepted

    def past_end(self, epoch: int, batch: int, first: int = 0) -> tuple[int, int]:
        """``(epoch, batch)``, or ``(epoch + 1, first)`` when ``batch`` is at or past the
        end of ``epoch`` (``first``: a DataLoader worker's own first batch)."""
        if batch >= self.stream.num_batches(epoch):
            return epoch + 1, first
        return epoch, batch

    def start(
        self, loaded: ReaderState | None, epoch: int, worker: int, workers: int
    ) -> tuple[int, int]:
        """``(epoch, first batch)`` of worker ``worker`` of ``workers``' pass: from
        ``loaded`` (a state loaded since the last pass) if any, else ``epoch``'s start."""
        if loaded is None:
            return self.past_end(epoch, worker, worker)
        if loaded.worker is not None:
            if loaded.worker != (worker, workers):
                raise ResumeError(
                    f"this state is DataLoader worker {loaded.worker[0]} of "
                    f"{loaded.worker[1]}'s own position, but it was loaded into worker "
                    f"{worker} of {workers}; resume with the same num_workers, or from a "
                    "loader-level state"
                )
            epoch, start = loaded.epoch, loaded.batch
        else:
            epoch, start = loaded.epoch, loaded.batch + worker
        return self.past_end(epoch, start, worker)  # resumed exactly at the end of an epoch
