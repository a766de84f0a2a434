"""A bare ``accelerate`` loop on a :class:`ShardstreamLoader`, its state in ``save_state``.

``accelerator.prepare(DataLoader(iterable_dataset))`` defaults to ``dispatch_batches=True``:
rank 0 reads every batch and broadcasts slices of it, which undoes the epoch plan's split
(each rank reading only its own disjoint share) and makes one rank do all the I/O; with
``dispatch_batches=False`` accelerate shards the iterable again by batch (each rank reads
everything and keeps every N-th batch). shardstream's loader needs neither: it is already
this rank's share. :func:`prepare_loader` therefore

* refuses ``dispatch_batches=True`` in one line naming the setting,
* checks that the loader reads as the rank accelerate runs (same rank, same world size),
* registers the loader with ``accelerator.register_for_checkpointing``, so
  ``accelerator.save_state(folder)`` stores its position and ``load_state(folder)`` restores
  it (O(1): no replay, unlike ``skip_first_batches``; on any world size whose global batch
  is the same), and returns the loader untouched for the training loop.

>>> loader = prepare_loader(accelerator, ShardstreamLoader(dataset))    # doctest: +SKIP
>>> model, optimizer = accelerator.prepare(model, optimizer)             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from shardstream.client.integrations.checkpoint_file import require
from shardstream.client.loader import ShardstreamLoader
from shardstream.errors import ConfigError

require("accelerate", "hf")

__all__ = ["prepare_loader", "refuse_dispatch_batches"]


def refuse_dispatch_batches(dispatch_batches: bool | None, setting: str) -> None:
    """One line when ``dispatch_batches=True``: rank 0 would read every batch for all."""
    if dispatch_batches:
        raise ConfigError(
            f"{setting}=True makes rank 0 read every batch and broadcast it, but each "
            "shardstream rank already reads its own disjoint share of the epoch plan: set "
            f"{setting}=False (or leave it unset)"
        )


def prepare_loader(accelerator: Any, loader: ShardstreamLoader) -> ShardstreamLoader:
    """Check ``accelerator``'s settings against ``loader`` and register the loader's state
    for ``save_state``/``load_state`` (see the module doc); returns ``loader`` itself."""
    config = getattr(accelerator, "dataloader_config", None)
    refuse_dispatch_batches(
        getattr(config, "dispatch_batches", None),
        "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=...))",
    )
    topology = loader.dataset.topology
    running = (accelerator.process_index, accelerator.num_processes)
    if (topology.rank, topology.world_size) != running:
        raise ConfigError(
            f"the loader reads as rank {topology.rank} of {topology.world_size} but accelerate "
            f"runs this process as {running[0]} of {running[1]}: build the StreamingDataset "
            "after Accelerator() (or pass topology=Topology(accelerator.process_index, "
            "accelerator.num_processes))"
        )
    accelerator.register_for_checkpointing(loader)
    return loader
