"""PyTorch Lightning on a :class:`ShardstreamLoader`: the position of the batch the model
trained on, in Lightning's checkpoint, restored whatever Lightning decides on resume.

Returned bare from ``train_dataloader()``, the loader would be saved by Lightning itself
(it has ``state_dict``/``load_state_dict``), but wrongly twice over: one batch ahead of the
model (Lightning fetches a batch ahead to know whether it is the last), and, training by
epochs from a checkpoint written at an epoch's end, not restored at all: Lightning does not
count that run as restarting and never calls ``load_state_dict`` (pytorch-lightning #20550,
so in 2.6.6), and the fresh loader reads epoch 0's order again. So:

* :class:`ShardstreamCheckpoint` (a ``Callback``) wraps the loader in ``train_dataloader()``
  (:meth:`ShardstreamCheckpoint.wrap`), notes the loader's state after each batch it hands
  out, takes the one of the batch Lightning is about to train (``on_train_batch_start``),
  and stores that under ``"shardstream"`` in every checkpoint;
* on resume it loads that state into the next loader it wraps (``train_dataloader()`` runs
  after Lightning restored the checkpoint), so nothing depends on Lightning's own restore;
* a bare ``ShardstreamLoader`` among the train iterables is refused at ``on_train_start``
  with one line that says why.

>>> checkpoint = ShardstreamCheckpoint()                                # doctest: +SKIP
>>> class Module(L.LightningModule):                                     # doctest: +SKIP
...     def train_dataloader(self):
...         return checkpoint.wrap(ShardstreamLoader(dataset))
>>> L.Trainer(callbacks=[checkpoint]).fit(Module(), ckpt_path=...)      # doctest: +SKIP
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from shardstream.client.integrations.checkpoint_file import require
from shardstream.client.loader import ShardstreamLoader
from shardstream.errors import ConfigError, ResumeError

require("lightning", "lightning")

from lightning.pytorch import Callback  # noqa: E402

__all__ = ["CHECKPOINT_KEY", "ShardstreamCheckpoint", "TrainedPosition"]

CHECKPOINT_KEY = "shardstream"
"""Where the loader's state is kept in Lightning's checkpoint dict."""


class TrainedPosition:
    """The train iterable Lightning sees: ``loader``'s batches, every epoch (a class, not a
    generator: Lightning iterates the same object each epoch), with the loader's state
    after each batch queued until the batch is trained. No ``state_dict`` of its own, so
    Lightning leaves its saving to :class:`ShardstreamCheckpoint`."""

    def __init__(self, loader: ShardstreamLoader) -> None:
        self.loader = loader
        self.ahead: deque[dict[str, Any]] = deque()  # states of fetched, untrained batches
        self.trained: dict[str, Any] = loader.state_dict()  # after the last trained batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            self.ahead.append(self.loader.state_dict())
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def trained_next(self) -> None:
        """The oldest fetched batch is being trained: its state becomes the position."""
        if self.ahead:
            self.trained = self.ahead.popleft()


class ShardstreamCheckpoint(Callback):
    """Keeps the position of the batch the model trained on in Lightning's checkpoints
    (see the module doc); ``wrap`` the loader with it in ``train_dataloader()``."""

    def __init__(self) -> None:
        self.data: TrainedPosition | None = None
        self.resume: dict[str, Any] | None = None

    def wrap(self, loader: ShardstreamLoader) -> TrainedPosition:
        """The iterable to return from ``train_dataloader()``; a restored position is
        loaded into ``loader`` first."""
        if self.resume is not None:
            loader.load_state_dict(self.resume)
            self.resume = None
        self.data = TrainedPosition(loader)
        return self.data

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        iterables = trainer.train_dataloader
        found = iterables.values() if isinstance(iterables, dict) else iterables
        found = found if isinstance(found, list | tuple) else [found]
        if any(isinstance(it, ShardstreamLoader) for it in found):
            raise ConfigError(
                "train_dataloader() returned a ShardstreamLoader itself: Lightning would save "
                "its state a batch ahead of the model and drop it when resuming from an "
                "epoch's end (pytorch-lightning #20550); return "
                "ShardstreamCheckpoint.wrap(loader) instead"
            )
        if self.data is None:
            raise ConfigError(
                "ShardstreamCheckpoint is in the callbacks but train_dataloader() did not "
                "return ShardstreamCheckpoint.wrap(loader): no data position would be saved"
            )

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        if self.data is not None:
            self.data.trained_next()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.data is not None:
            checkpoint[CHECKPOINT_KEY] = self.data.trained

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if CHECKPOINT_KEY not in checkpoint:
            raise ResumeError(
                "this Lightning checkpoint holds no shardstream data position (key "
                f"{CHECKPOINT_KEY!r}): it was not saved with ShardstreamCheckpoint; resume from "
                "one that was"
            )
        self.resume = checkpoint[CHECKPOINT_KEY]
