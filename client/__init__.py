"""shardstream's training-node SDK: stream MDS shards into PyTorch, resume exactly.

>>> from shardstream.client import StreamingDataset, ShardstreamLoader
>>> ds = StreamingDataset("s3://bucket/tokens/index.json", batch_size=32)  # doctest: +SKIP
>>> loader = ShardstreamLoader(ds, num_workers=2)                          # doctest: +SKIP
>>> for batch in loader: ...                                               # doctest: +SKIP

The public names below are imported lazily, so that importing a submodule such as
``shardstream.client.plan`` (pure numpy) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream.client.batches.image_augment import RandomResizedCropFlip
    from shardstream.client.dataset import StreamingDataset
    from shardstream.client.distributed import Topology
    from shardstream.client.loader import ShardstreamLoader, WorkerError
    from shardstream.client.options import (
        CacheOptions,
        DecodeOptions,
        PackOptions,
        PlanOptions,
        ReadOptions,
        ServerOptions,
        Source,
    )
    from shardstream.client.state import ReaderState
    from shardstream.plan import MixtureSchedule, Phase

__all__ = [
    "CacheOptions",
    "DecodeOptions",
    "MixtureSchedule",
    "PackOptions",
    "Phase",
    "PlanOptions",
    "RandomResizedCropFlip",
    "ReadOptions",
    "ReaderState",
    "ServerOptions",
    "ShardstreamLoader",
    "Source",
    "StreamingDataset",
    "Topology",
    "WorkerError",
]

_HOMES = {
    "CacheOptions": "options",
    "DecodeOptions": "options",
    "MixtureSchedule": "plan",
    "PackOptions": "options",
    "Phase": "plan",
    "PlanOptions": "options",
    "RandomResizedCropFlip": "batches.image_augment",
    "ReadOptions": "options",
    "ReaderState": "state",
    "ServerOptions": "options",
    "ShardstreamLoader": "loader",
    "Source": "options",
    "StreamingDataset": "dataset",
    "Topology": "distributed",
    "WorkerError": "loader",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shardstream.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"shardstream.client.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
