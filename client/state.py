"""The resume state: where in the global sample sequence a reader stands, and everything the
order at that position depends on. It is the one resume state of shardstream: what
``state_dict()`` returns, what the server's checkpoints hold, and what a resume is checked
against.

A position is two integers, ``(epoch, batch)``: ``batch`` global batches of ``epoch`` have
been consumed. With the plan parameters and the versions read, that is all a resume needs:
the plan maps any position to its samples by arithmetic, so resuming is O(1) and reads no
skipped data. The position counts *global* batches, so it is valid for any number of
ranks (any world size dividing the global batch) and workers; the global batch size must
stay the same, and a resumed reader adopts the saved partition count and window.

Beside the position, the state carries what decides the order there:

* ``algorithm``: the version of the order algorithm (``PLAN_ALGORITHM``). A client whose
  algorithm differs would continue in another order, so it refuses the state.
* ``plan``: the plan parameters in force (seed, shuffle, tail, global batch size,
  partitions, window, epoch size, the mixture's weights, repeats and counts).
* ``versions``: the immutable version ids of the sources, in order.
* ``fingerprint``: :attr:`EpochPlan.fingerprint`, a digest of the algorithm, the
  parameters and every source's shard sizes (the index content the order is computed
  from); a state whose parameters match but whose fingerprint does not was saved over
  other data.

A resume whose state differs from what the reader computes is refused with one
:class:`ResumeError` that names *every* difference. A caller may accept named differences
(``allow_changes``): the change is recorded in the state (``changes``), so every later
checkpoint shows that the run's order changed there and why.

``worker`` is set only in the state of one DataLoader worker (what torchdata's
``StatefulDataLoader`` saves per worker): that worker's own next batch.

Format 2 added ``algorithm``, ``fingerprint`` and ``changes``; a format-1 state (from an
earlier client) is read as algorithm 1 (the only one there was) without a fingerprint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shardstream.errors import ResumeError

__all__ = ["STATE_FORMAT", "ReaderState"]

STATE_FORMAT = 2
"""Version of the ``state_dict`` layout (1 is still read)."""

_READABLE_FORMATS = (1, STATE_FORMAT)

CHANGEABLE = ("versions", "algorithm", "fingerprint")
"""What ``allow_changes`` may name besides plan parameters (``"seed"``, ``"window"``...)."""


@dataclass(frozen=True)
class ReaderState:
    """A resumable position plus everything the order there depends on (see module doc).

    ``samples`` (derived) is the number of samples of the epoch consumed, what the server
    stores as ``sample_in_epoch``.
    """

    epoch: int
    batch: int
    plan: Mapping[str, Any]
    versions: tuple[str, ...]
    weights: tuple[float | None, ...] = ()
    worker: tuple[int, int] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    algorithm: int = 1
    fingerprint: str | None = None
    changes: tuple[Mapping[str, Any], ...] = ()

    @property
    def samples(self) -> int:
        """Samples of the epoch consumed (batches x global batch size)."""
        return self.batch * int(self.plan.get("global_batch_size", 0))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (what ``state_dict()`` returns)."""
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "algorithm": self.algorithm,
            "epoch": self.epoch,
            "batch": self.batch,
            "samples": self.samples,
            "plan": dict(self.plan),
            "versions": list(self.versions),
            "weights": list(self.weights),
            "fingerprint": self.fingerprint,
            "worker": None if self.worker is None else list(self.worker),
        }
        if self.changes:
            out["changes"] = [dict(c) for c in self.changes]
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ReaderState:
        """Parse a ``state_dict``; :class:`ResumeError` naming the field if malformed."""
        if not isinstance(state, Mapping):
            raise ResumeError(f"a shardstream state must be a dict, got {type(state).__name__}")
        fmt = state.get("format")
        if fmt not in _READABLE_FORMATS:
            raise ResumeError(
                f"state format {fmt!r} is not one this shardstream version reads "
                f"({', '.join(map(str, _READABLE_FORMATS))}); it was not written by a "
                "shardstream state_dict(), or by a newer shardstream than this one"
            )
        try:
            epoch, batch = int(state["epoch"]), int(state["batch"])
            plan = dict(state["plan"])
            versions = tuple(str(v) for v in state["versions"])
            weights = tuple(None if w is None else float(w) for w in state.get("weights", ()))
            worker = state.get("worker")
            slot = None if worker is None else (int(worker[0]), int(worker[1]))
            algorithm = int(state.get("algorithm", 1))
            fingerprint = state.get("fingerprint")
            if fingerprint is not None and not isinstance(fingerprint, str):
                raise TypeError(f"fingerprint must be a string, got {fingerprint!r}")
            changes = tuple(dict(c) for c in state.get("changes", ()))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ResumeError(f"malformed shardstream state: {exc!r} in {dict(state)!r}") from None
        if epoch < 0 or batch < 0:
            raise ResumeError(f"state has a negative position (epoch={epoch}, batch={batch})")
        return cls(epoch, batch, plan, versions, weights, slot, {}, algorithm, fingerprint, changes)

    @classmethod
    def from_stateful_loader(cls, state: Mapping[str, Any]) -> ReaderState:
        """The global position in a torchdata ``StatefulDataLoader.state_dict()``.

        Such a state holds one position per DataLoader worker (each worker's next batch,
        snapshotted as the loader hands out that worker's batches), and torchdata only
        loads it into a loader with the same ``num_workers``. Round-robin means the
        consumed batches are exactly those below the smallest next batch, so the earliest
        worker position *is* the global one: a position any worker count (or the main
        process) can resume from. The workers' states must agree on everything but their
        position (a mix of two runs' worker states is refused).
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
            other.check_compatible(first.expected())
        return replace(first, worker=None)

    def expected(self) -> ReaderState:
        """This state's order-defining fields, position aside (what another must match)."""
        return ReaderState(
            0, 0, self.plan, self.versions, algorithm=self.algorithm, fingerprint=self.fingerprint
        )

    def differences(self, current: ReaderState) -> dict[str, tuple[Any, Any]]:
        """``{name: (saved, now)}`` for every order-defining field that differs."""
        found: dict[str, tuple[Any, Any]] = {}
        if self.algorithm != current.algorithm:
            found["algorithm"] = (self.algorithm, current.algorithm)
        if self.versions != current.versions:
            found["versions"] = (list(self.versions), list(current.versions))
        for key in sorted(set(self.plan) | set(current.plan)):
            if self.plan.get(key) != current.plan.get(key):
                found[key] = (self.plan.get(key), current.plan.get(key))
        if (
            not found
            and self.fingerprint is not None
            and current.fingerprint is not None
            and self.fingerprint != current.fingerprint
        ):
            found["fingerprint"] = (self.fingerprint, current.fingerprint)
        return found

    def check_compatible(
        self, current: ReaderState, allow_changes: Iterable[str] = ()
    ) -> ReaderState:
        """This state, checked against what the reader computes now (``current``).

        Raises :class:`ResumeError` naming every difference that ``allow_changes`` does not
        accept; returns the state to resume from, with accepted differences recorded in
        ``changes`` and the current algorithm, plan, versions and fingerprint in force.
        """
        allowed = set(allow_changes)
        found = self.differences(current)
        refused = {k: v for k, v in found.items() if k not in allowed}
        if refused:
            lines = [f"  {k}: saved {old!r}, now {new!r}" for k, (old, new) in refused.items()]
            raise ResumeError(
                f"this state cannot resume this reader: {len(refused)} "
                f"difference{'s' if len(refused) != 1 else ''} in what decides the order\n"
                + "\n".join(lines)
                + "\n"
                + _advice(refused)
            )
        if not found:
            return self
        change = {
            "epoch": self.epoch,
            "batch": self.batch,
            "changed": {name: [old, new] for name, (old, new) in found.items()},
        }
        return replace(
            self,
            plan=current.plan,
            versions=current.versions,
            algorithm=current.algorithm,
            fingerprint=current.fingerprint,
            changes=(*self.changes, change),
        )


def _advice(refused: Mapping[str, Any]) -> str:
    if "algorithm" in refused:
        return (
            "the state was written by a shardstream whose order algorithm differs: resume with "
            "that version, or accept the new order with allow_changes=['algorithm']"
        )
    if "versions" in refused or "fingerprint" in refused:
        return (
            "resume with the same dataset versions (pin them as name@version), or accept the "
            "change with allow_changes=[...] (recorded in the state)"
        )
    return (
        "keep these the same (and the global batch size = batch_size x world size) to resume, "
        "or accept them with allow_changes=[...] (recorded in the state)"
    )


def _collect(node: Any, found: list[ReaderState]) -> None:
    """Every ``dataset_state`` written by this module, anywhere in ``node``."""
    if isinstance(node, Mapping):
        if node.get("format") in _READABLE_FORMATS and "batch" in node and "plan" in node:
            found.append(ReaderState.from_dict(node))
            return
        for value in node.values():
            _collect(value, found)
