"""Where this process sits in the job: rank, world size, node-local rank, DataLoader worker.

Rank and world size come from ``torch.distributed`` when a process group is initialized,
else from the variables every launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``: torchrun, Lightning, Accelerate, SLURM wrappers), else a single
process. Nothing here issues a collective call: the dataset must never block on its peers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist
import torch.utils.data

from shardstream.errors import ConfigError

__all__ = ["Topology", "WorkerSlot", "current_worker"]


@dataclass(frozen=True)
class Topology:
    """This process's place among the training ranks.

    ``rank`` / ``world_size`` index the ranks of the whole job; ``local_rank`` /
    ``local_world_size`` the ranks on this node (they share one shard cache).

    >>> Topology(rank=1, world_size=4).rank
    1
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    local_world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank must be in [0, world_size={self.world_size}), got {self.rank}; "
                "check RANK and WORLD_SIZE"
            )

    @classmethod
    def discover(cls, environ: Mapping[str, str] | None = None) -> Topology:
        """The topology from ``torch.distributed`` if initialized, else the environment."""
        env = os.environ if environ is None else environ
        local_rank = _env_int(env, "LOCAL_RANK")
        local_world = _env_int(env, "LOCAL_WORLD_SIZE")
        if dist.is_available() and dist.is_initialized():
            # Reading the group's rank and size is local state, not a collective.
            return cls(dist.get_rank(), dist.get_world_size(), local_rank, local_world)
        rank = _env_int(env, "RANK")
        world = _env_int(env, "WORLD_SIZE")
        if rank is None and world is None:
            return cls(0, 1, local_rank, local_world)
        if rank is None or world is None:
            raise ConfigError(
                "RANK and WORLD_SIZE must be set together (found only "
                f"{'RANK' if rank is not None else 'WORLD_SIZE'}); launch with torchrun or "
                "pass an explicit Topology"
            )
        return cls(rank, world, local_rank, local_world)


@dataclass(frozen=True)
class WorkerSlot:
    """This process's DataLoader worker: ``worker_id`` of ``num_workers`` (0 of 1 in main)."""

    worker_id: int = 0
    num_workers: int = 1
    in_worker: bool = False


def current_worker() -> WorkerSlot:
    """The worker slot from ``torch.utils.data.get_worker_info()``; ``(0, 1)`` outside workers."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return WorkerSlot()
    return WorkerSlot(info.id, info.num_workers, in_worker=True)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None
