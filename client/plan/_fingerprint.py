"""The plan's fingerprint: a digest of everything the order depends on except the epoch.

The resume state (:class:`shardstream.client.state.ReaderState`, the one home of that
concept) carries it, so a state is never applied to a plan over other data, parameters or
algorithm.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from shardstream.client.plan._config import PlanConfig, SourceSpec


def plan_fingerprint(algorithm: int, config: PlanConfig, sources: Sequence[SourceSpec]) -> str:
    """sha256 (first 32 hex digits) of the algorithm version, the config, and every
    source's name/version, mixture setting and shard sizes."""
    h = hashlib.sha256(f"{algorithm}:{config!r}".encode())
    for s in sources:
        h.update(repr((s.name, s.weight, s.repeat, s.count)).encode())
        h.update(np.ascontiguousarray(s.shard_sizes, dtype="<i8").tobytes())
    return h.hexdigest()[:32]
