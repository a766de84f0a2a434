"""The resume state: where in the global sample sequence a reader stands.

A position is two integers, ``(epoch, batch)``: ``batch`` global batches of ``epoch`` have
been consumed. With the plan parameters and the versions read, that is all a resume needs:
the plan maps any position to its samples by arithmetic, so resuming is O(1) and reads no
skipped data. The position counts *global* batches, so it is valid for any number of
ranks (any world size dividing the global batch) and workers; the global batch size must
stay the same, and a resumed reader adopts the saved partition count and window.

``worker`` is set only in the state of one DataLoader worker (what torchdata's
``StatefulDataLoader`` saves per worker): that worker's own next batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardstream.errors import ResumeError

__all__ = ["STATE_FORMAT", "ReaderState"]

STATE_FORMAT = 1
"""Version of the ``state_dict`` layout."""


@dataclass(frozen=True)
class ReaderState:
    """A resumable position plus what it must be resumed against.

    ``plan`` holds the plan parameters in force (seed, shuffle, tail, global batch size,
    partitions, window); ``versions`` the version ids of the sources, in order;
    ``weights`` their mixture weights. ``samples`` (derived) is the number of samples of
    the epoch consumed, what the server stores as ``sample_in_epoch``.
    """

    epoch: int
    batch: int
    plan: Mapping[str, Any]
    versions: tuple[str, ...]
    weights: tuple[float | None, ...] = ()
    worker: tuple[int, int] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        """Samples of the epoch consumed (batches x global batch size)."""
        return self.batch * int(self.plan.get("global_batch_size", 0))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (what ``state_dict()`` returns)."""
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "batch": self.batch,
            "samples": self.samples,
            "plan": dict(self.plan),
            "versions": list(self.versions),
            "weights": list(self.weights),
            "worker": None if self.worker is None else list(self.worker),
        }
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ReaderState:
        """Parse a ``state_dict``; :class:`ResumeError` naming the field if malformed."""
        if not isinstance(state, Mapping):
            raise ResumeError(f"a shardstream state must be a dict, got {type(state).__name__}")
        fmt = state.get("format")
        if fmt != STATE_FORMAT:
            raise ResumeError(
                f"state format {fmt!r} is not {STATE_FORMAT}; it was not written by this "
                "shardstream version's state_dict()"
            )
        try:
            epoch, batch = int(state["epoch"]), int(state["batch"])
            plan = dict(state["plan"])
            versions = tuple(str(v) for v in state["versions"])
            weights = tuple(None if w is None else float(w) for w in state.get("weights", ()))
            worker = state.get("worker")
            slot = None if worker is None else (int(worker[0]), int(worker[1]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ResumeError(f"malformed shardstream state: {exc!r} in {dict(state)!r}") from None
        if epoch < 0 or batch < 0:
            raise ResumeError(f"state has a negative position (epoch={epoch}, batch={batch})")
        return cls(epoch, batch, plan, versions, weights, slot)

    @classmethod
    def from_stateful_loader(cls, state: Mapping[str, Any]) -> ReaderState:
        """The global position in a torchdata ``StatefulDataLoader.state_dict()``.

        Such a state holds one position per DataLoader worker (each worker's next batch,
        snapshotted as the loader hands out that worker's batches), and torchdata only
        loads it into a loader with the same ``num_workers``. Round-robin means the
        consumed batches are exactly those below the smallest next batch, so the earliest
        worker position *is* the global one: a position any worker count (or the main
        process) can resume from.
        """
        found: list[ReaderState] = []
        _collect(state, found)
        if not found:
            raise ResumeError(
                "this StatefulDataLoader state holds no shardstream dataset state; was it "
                "saved from a loader over a StreamingDataset?"
            )
        first = min(found, key=lambda s: (s.epoch, s.batch))
        for other in found:
            other.check_compatible(first.plan, first.versions)
        return cls(first.epoch, first.batch, first.plan, first.versions, first.weights)

    def check_compatible(self, plan: Mapping[str, Any], versions: tuple[str, ...]) -> None:
        """Raise :class:`ResumeError` unless this state can resume a reader with these
        plan parameters and versions (naming the first difference)."""
        if self.versions != versions:
            raise ResumeError(
                f"the state was saved reading versions {list(self.versions)}, this reader "
                f"reads {list(versions)}; resume with the same dataset versions "
                "(pin them as name@version)"
            )
        for key in sorted(set(self.plan) | set(plan)):
            if self.plan.get(key) != plan.get(key):
                raise ResumeError(
                    f"plan parameter {key!r} was {self.plan.get(key)!r} when the state was "
                    f"saved and is {plan.get(key)!r} now; keep it (and the global batch size "
                    "= batch_size x world size) the same to resume"
                )


def _collect(node: Any, found: list[ReaderState]) -> None:
    """Every ``dataset_state`` written by this module, anywhere in ``node``."""
    if isinstance(node, Mapping):
        if node.get("format") == STATE_FORMAT and "batch" in node and "plan" in node:
            found.append(ReaderState.from_dict(node))
            return
        for value in node.values():
            _collect(value, found)
