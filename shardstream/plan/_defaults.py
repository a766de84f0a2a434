"""Default plan shape of a fresh run: how many canonical partitions, how wide a window.

The defaults are chosen once, by the first run, and saved in every resume state; a resumed
reader that leaves them unset adopts the saved values (the client's resume does:
``shardstream.client.resume``), so the global order never depends on the world size a run
is resumed on. The plan reads on any world
size that divides the global batch (see :meth:`PlanConfig.check_world_size`); these
defaults only decide how *local* and how *mixed* that is:

* ``P = W x d`` partitions: ``d`` is the largest divisor of ``B / W`` up to
  ``max(4, 8 / W)`` (:data:`PARTITIONS_PER_RANK`) that is a multiple of ``m``, the
  partitions a rank read under the earlier default (``P`` = the largest divisor of ``B``
  up to ``max(8, W)`` that ``W`` divides or is divided by). A multiple of ``W`` makes the
  first run exactly local (every node owns whole partitions); being a multiple of the
  earlier ``P`` keeps every node count that was exact before exact; the extra factor makes
  more later node counts divide ``P`` (3 ranks -> 12 partitions: 2, 4, 6 and 12 nodes stay
  exact) and shrinks the cost for those that do not (a node reads at most its share plus
  two partitions, a partition being ``1 / P`` of the epoch).
* A rank's mixing window, summed over its ``d`` partitions, is what a rank had before
  (``m`` partitions of 8 shards; :func:`rank_window_shards`): a batch still draws from as
  many shards, and the cache a rank needs grows only by the few shards each extra
  partition keeps open at its block edges.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.plan._config import SourceSpec

__all__ = ["PARTITIONS_PER_RANK", "default_shape", "rank_window_shards"]

PARTITIONS_PER_RANK = 4
"""Most canonical partitions a rank reads by default (``d``), unless it read more before."""


def earlier_partitions_per_rank(global_batch_size: int, world_size: int) -> int:
    """``m``: partitions a rank read under the earlier default: the largest divisor of
    ``B / W`` up to ``8 / W`` (at least 1)."""
    per_rank = global_batch_size // world_size
    cap = max(1, 8 // world_size)
    return max(m for m in range(1, cap + 1) if per_rank % m == 0)


def rank_window_shards(global_batch_size: int, world_size: int) -> int:
    """Shards' worth of mixing window one rank reads from at a time, by default: 8 shards
    for each of the ``m`` partitions a rank read before (see the module docstring)."""
    return 8 * earlier_partitions_per_rank(global_batch_size, world_size)


def default_shape(
    global_batch_size: int, world_size: int, sources: Sequence[SourceSpec]
) -> tuple[int, int | None]:
    """``(num_partitions, window)`` for a fresh run on ``world_size`` ranks.

    ``global_batch_size`` must be a multiple of ``world_size`` (the plan checks that).

    >>> import numpy as np
    >>> default_shape(120, 3, [SourceSpec(shard_sizes=np.full(10, 100))])
    (12, 400)
    """
    per_rank = global_batch_size // world_size
    m = earlier_partitions_per_rank(global_batch_size, world_size)
    cap = max(PARTITIONS_PER_RANK, 8 // world_size)
    d = max(k for k in range(m, cap + 1, m) if per_rank % k == 0)
    shards = sum(s.shard_sizes.size for s in sources)
    mean_shard = -(-sum(s.num_samples for s in sources) // max(1, shards))
    window = max(1, rank_window_shards(global_batch_size, world_size) * mean_shard // d)
    return world_size * d, window
