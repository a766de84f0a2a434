"""The plan's inputs: :class:`PlanConfig` (run-wide parameters) and :class:`SourceSpec`.

Both are frozen and validated on construction; a bad value or a bad combination raises
:class:`~shardstream.errors.PlanError` naming the setting and what to do.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from shardstream.errors import PlanError

Tail = Literal["drop", "pad"]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PlanError(f"PlanConfig.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise PlanError(f"PlanConfig.{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """Run-wide plan parameters; every rank of every node must use the same values.

    Args:
        seed: base seed of the run (>= 0); with ``epoch`` it determines the whole order.
        global_batch_size: samples per global batch ``B`` (over all ranks).
        num_partitions: canonical partitions ``P``; ``B % P == 0``. The unit of locality: a
            node downloads only the shards of the partitions its ranks' slices touch, so
            locality is exact for node counts that divide ``P``. Any world size dividing
            ``B`` can read (and resume) the plan. Resuming requires the same ``B`` and ``P``.
        shuffle: permute shards per epoch and mix samples inside windows; ``False`` reads
            every partition in storage order.
        tail: ``"drop"`` the last partial global batch, or ``"pad"`` it by repeating
            samples from the start of the epoch. Either way every rank gets the same number
            of batches.
        window: mixing window in samples per partition (the cache a partition needs is
            about ``window / samples_per_shard + 2`` shards). ``None``: 8 shards' worth.
        epoch_size: samples per epoch shared by weighted sources (see :class:`SourceSpec`);
            ``None``: the weighted sources' own total.
    """

    seed: int = 0
    global_batch_size: int
    num_partitions: int = 1
    shuffle: bool = True
    tail: Tail = "drop"
    window: int | None = None
    epoch_size: int | None = None

    def __post_init__(self) -> None:
        _check_int("seed", self.seed, 0)
        _check_int("global_batch_size", self.global_batch_size, 1)
        _check_int("num_partitions", self.num_partitions, 1)
        if self.global_batch_size % self.num_partitions:
            raise PlanError(
                f"PlanConfig.global_batch_size={self.global_batch_size} is not divisible by "
                f"num_partitions={self.num_partitions}: every partition contributes "
                f"global_batch_size / num_partitions samples to each global batch; pick a "
                f"num_partitions that divides the batch size"
            )
        if not isinstance(self.shuffle, bool):
            raise PlanError(f"PlanConfig.shuffle must be True or False, got {self.shuffle!r}")
        if self.tail not in ("drop", "pad"):
            raise PlanError(f"PlanConfig.tail must be 'drop' or 'pad', got {self.tail!r}")
        if self.window is not None:
            _check_int("window", self.window, 1)
        if self.epoch_size is not None:
            _check_int("epoch_size", self.epoch_size, 1)

    @property
    def partition_batch_size(self) -> int:
        """Samples each partition contributes to one global batch (``B / P``)."""
        return self.global_batch_size // self.num_partitions

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`PlanError` unless ``world_size`` ranks can share this plan.

        Any world size that divides the global batch size can: a rank reads a contiguous
        ``B / world_size`` slice of every global batch, whatever ``num_partitions`` is, so a
        run resumes on any such world size (locality is exact when the node count divides
        ``num_partitions``; see ``docs/plan.md``).
        """
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)):
            raise PlanError(f"world_size must be an integer, got {world_size!r}")
        if world_size < 1:
            raise PlanError(f"world_size must be >= 1, got {world_size}")
        if self.global_batch_size % world_size:
            raise PlanError(
                f"global_batch_size={self.global_batch_size} is not divisible by "
                f"world_size={world_size}: every rank must get the same batch size"
            )

    def rank_batch_size(self, world_size: int) -> int:
        """Samples per rank per batch (``B / world_size``), after checking ``world_size``."""
        self.check_world_size(world_size)
        return self.global_batch_size // world_size


def _as_sizes(value: ArrayLike, name: str) -> NDArray[np.int64]:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.size == 0:
        raise PlanError(f"SourceSpec {name}: shard_sizes must be a non-empty 1-D array")
    if arr.dtype.kind not in "iu":
        raise PlanError(f"SourceSpec {name}: shard_sizes must be integers, got {arr.dtype}")
    sizes = arr.astype(np.int64)
    if (sizes < 0).any():
        bad = int(np.flatnonzero(sizes < 0)[0])
        raise PlanError(f"SourceSpec {name}: shard {bad} has a negative sample count")
    if int(sizes.sum()) == 0:
        raise PlanError(f"SourceSpec {name}: all shards are empty")
    sizes.setflags(write=False)
    return sizes


@dataclass(frozen=True, eq=False, kw_only=True)
class SourceSpec:
    """One dataset version in the plan, and how many of its samples an epoch takes.

    Set at most one of ``weight``, ``repeat`` and ``count``:

    * nothing: every sample once per epoch (``repeat=1``);
    * ``repeat=r``: ``round(r * samples)`` per epoch (``r < 1`` subsamples, ``r > 1``
      repeats; fractional parts rotate so later epochs see the samples left out before);
    * ``count=n``: exactly ``n`` samples per epoch;
    * ``weight=w``: a proportion; all weighted sources share ``PlanConfig.epoch_size`` minus
      the samples of the ``repeat``/``count`` sources (default: their own total) in
      proportion to their weights.

    ``name`` should carry the version id (e.g. ``"books@v3"``): it appears in error messages
    and in the plan's fingerprint, so a resume state cannot be applied to another version.

    >>> SourceSpec(shard_sizes=np.array([100, 100]), repeat=0.5).shard_sizes.tolist()
    [100, 100]
    """

    shard_sizes: NDArray[np.int64] = field(repr=False)
    weight: float | None = None
    repeat: float | None = None
    count: int | None = None
    name: str = ""

    def __post_init__(self) -> None:
        label = repr(self.name) if self.name else "(unnamed)"
        object.__setattr__(self, "shard_sizes", _as_sizes(self.shard_sizes, label))
        modes = [m for m in ("weight", "repeat", "count") if getattr(self, m) is not None]
        if len(modes) > 1:
            raise PlanError(
                f"SourceSpec {label}: set only one of weight, repeat and count (got "
                f"{', '.join(modes)})"
            )
        for m in ("weight", "repeat"):
            v = getattr(self, m)
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
            if v is not None and not (ok and math.isfinite(v) and v > 0):
                raise PlanError(f"SourceSpec {label}: {m} must be a finite number > 0, got {v!r}")
        if self.count is not None and (
            isinstance(self.count, bool)
            or not isinstance(self.count, (int, np.integer))
            or self.count < 1
        ):
            raise PlanError(
                f"SourceSpec {label}: count must be an integer >= 1, got {self.count!r}"
            )

    @property
    def num_samples(self) -> int:
        """Samples stored in this source (sum of its shard sizes)."""
        return int(self.shard_sizes.sum())
