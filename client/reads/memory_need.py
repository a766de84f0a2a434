"""How much memory the cacheless mode needs: the plan's mixing window, in bytes.

In cacheless mode a shard's blocks must stay in memory from the first batch that reads the
shard to the last one: the window mixes its samples over that whole span, so almost every
block is used again until then. A budget below the peak of the shards held at once cannot
hold what the next batches need; blocks would be evicted before their last use and fetched
again, over and over (a benchmark fetched 32x its dataset that way). The stream checks the
budget against this figure before the first read and refuses a budget that is too small.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream.errors import ConfigError

__all__ = ["check_memory_need", "window_need_bytes"]


def window_need_bytes(
    first: np.ndarray[Any, Any],
    last: np.ndarray[Any, Any],
    sizes: np.ndarray[Any, Any],
    *,
    lead: int = 0,
) -> int:
    """Peak bytes of shards held at once: shard ``i`` (``sizes[i]`` bytes) is held from
    batch ``first[i] - lead`` (its blocks are fetched ``lead`` batches ahead) to ``last[i]``."""
    if len(sizes) == 0:
        return 0
    starts = np.asarray(first, dtype=np.int64) - lead
    ends = np.asarray(last, dtype=np.int64) + 1
    when = np.concatenate([starts, ends])
    delta = np.concatenate([np.asarray(sizes, np.int64), -np.asarray(sizes, np.int64)])
    order = np.lexsort((delta, when))  # at equal times, releases before acquisitions
    return int(np.cumsum(delta[order]).max())


def check_memory_need(budget: int, need: int) -> None:
    """Refuse a memory budget below the window's need (:class:`ConfigError`)."""
    if need > budget:
        raise ConfigError(
            f"cacheless reads need {need} bytes of memory for the plan's mixing window "
            f"(the shards read at once), but ReadOptions.memory_budget_bytes is {budget}: "
            f"blocks would be evicted before their last use and fetched again. Raise "
            f"memory_budget_bytes to at least {need}, or lower PlanOptions.window / "
            "num_partitions, or use the cache mode"
        )
