"""Hugging Face ``Trainer`` on a :class:`ShardstreamLoader`: exact, elastic resume, no replay.

Left alone, the ``Trainer`` resumes its data by *replaying* it: ``skip_first_batches``
reads and throws away every batch before the checkpoint's step (at step 100,000, 100,000
batches), and ``ignore_data_skip=True`` restarts the data from the beginning instead.
With shardstream the position is a few integers, so:

* :class:`ShardstreamTrainer` (or :class:`ShardstreamTrainerMixin` in front of your own
  ``Trainer`` subclass) trains from the loader as it is: ``accelerator.prepare`` is not
  applied to it (it would dispatch or re-shard batches that the epoch plan already split
  between ranks), and ``set_epoch`` does not reset it (its epoch follows its state);
* :class:`ShardstreamCallback` writes the loader's state into every ``checkpoint-N/``
  (:mod:`~shardstream.client.integrations.checkpoint_file`) and, when the dataset has a
  run on the metadata server, commits step ``N`` to it;
* ``train(resume_from_checkpoint=...)`` loads that state back (O(1), nothing replayed),
  after checking that it is the state of the step the model is at, and turns the
  Trainer's own data skip off (``ignore_data_skip``), since there is nothing to skip.

The state is a global position, so a run saved on 2 ranks resumes on 3 (with the same
global batch: the dataset's ``batch_size`` x ranks). ``per_device_train_batch_size`` is
not used for reading: the dataset's ``batch_size`` is the per-rank batch.

>>> trainer = ShardstreamTrainer(model=model, args=args, train_dataset=loader)  # doctest: +SKIP
>>> trainer.train(resume_from_checkpoint=True)                                   # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from shardstream.client.integrations.checkpoint_file import (
    require,
    restore_loader,
    write_data_state,
)
from shardstream.client.integrations.hf_accelerate import refuse_dispatch_batches
from shardstream.client.loader import ShardstreamLoader
from shardstream.errors import ConfigError

require("transformers", "hf")

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint  # noqa: E402
from transformers.training_args import TrainingArguments  # noqa: E402

__all__ = [
    "ShardstreamCallback",
    "ShardstreamTrainer",
    "ShardstreamTrainerMixin",
]

FRAMEWORK = "Hugging Face Trainer"
TRAINER_STATE = "trainer_state.json"


class _TrainerLoader:
    """The loader as the Trainer sees it: iterable, sized, with no ``set_epoch`` (the
    Trainer's epoch count restarts after a resume and would rewind the loader)."""

    def __init__(self, loader: ShardstreamLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class ShardstreamCallback(TrainerCallback):
    """Saves the loader's state into every ``checkpoint-N/`` and commits step ``N`` to the
    dataset's run (when it has one). Added by :class:`ShardstreamTrainerMixin`."""

    def __init__(self, loader: ShardstreamLoader) -> None:
        self.loader = loader

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        step = state.global_step
        if args.should_save:  # process zero (of each node with save_on_each_node)
            folder = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")
            write_data_state(folder, step, self.loader, FRAMEWORK)
        server = self.loader.dataset.server
        if state.is_world_process_zero and server is not None and server.run is not None:
            self.loader.commit(step)


class ShardstreamTrainerMixin:
    """Put in front of a ``Trainer`` class (``class MyTrainer(ShardstreamTrainerMixin,
    SFTTrainer)``) to train it from a :class:`ShardstreamLoader` (see the module doc).

    ``train_dataset`` is the loader, or a ``StreamingDataset`` (a loader is then made with
    ``args.dataloader_num_workers`` workers)."""

    args: TrainingArguments

    def __init__(self, *args: Any, train_dataset: Any = None, **kwargs: Any) -> None:
        from shardstream.client.dataset import StreamingDataset

        if isinstance(train_dataset, StreamingDataset):
            targs = kwargs.get("args", args[1] if len(args) > 1 else None)
            workers = targs.dataloader_num_workers if targs is not None else 0
            train_dataset = ShardstreamLoader(train_dataset, num_workers=workers)
        if not isinstance(train_dataset, ShardstreamLoader):
            raise ConfigError(
                f"{type(self).__name__}(train_dataset=...) takes a ShardstreamLoader or a "
                f"StreamingDataset, got {type(train_dataset).__name__}"
            )
        self.shardstream_loader = train_dataset
        # The Trainer checks the dataset's length and kind; batches come from the loader.
        super().__init__(*args, train_dataset=train_dataset.dataset, **kwargs)  # type: ignore[call-arg]
        accel = getattr(self.args, "accelerator_config", None)
        refuse_dispatch_batches(
            getattr(accel, "dispatch_batches", None),
            "TrainingArguments(accelerator_config={'dispatch_batches': ...})",
        )
        self.add_callback(ShardstreamCallback(train_dataset))  # type: ignore[attr-defined]

    def get_train_dataloader(self) -> Any:
        """The loader itself: never ``accelerator.prepare``-d (see the module doc)."""
        return _TrainerLoader(self.shardstream_loader)

    def num_examples(self, dataloader: Any) -> int:
        """Samples per epoch on this rank (the Trainer's log line), for our loader."""
        if isinstance(dataloader, _TrainerLoader):
            return len(dataloader) * dataloader.loader.dataset.stream.batch_size
        examples: int = super().num_examples(dataloader)  # type: ignore[misc]
        return examples

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        """``Trainer.train``, with the data restored from the checkpoint's own state.

        The checkpoint folder is the one the Trainer restores (``True``: the newest in
        ``output_dir``); its data state must be that of the model's step, else this raises
        :class:`~shardstream.errors.ResumeError` before any batch is read."""
        self.args.ignore_data_skip = True  # the loader's state is the position: skip nothing
        folder = resume_from_checkpoint
        if folder is True:
            folder = get_last_checkpoint(self.args.output_dir)  # type: ignore[no-untyped-call]
        if isinstance(folder, str | os.PathLike):
            restore_loader(self.shardstream_loader, folder, _model_step(folder), FRAMEWORK)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)  # type: ignore[misc]


def _model_step(folder: str | os.PathLike[str]) -> int:
    """The step the model in ``folder`` is at, from the Trainer's own ``trainer_state.json``."""
    path = os.path.join(folder, TRAINER_STATE)
    try:
        return int(TrainerState.load_from_json(path).global_step)
    except FileNotFoundError:
        raise ConfigError(
            f"{folder} is not a Trainer checkpoint (no {TRAINER_STATE}); "
            "pass a checkpoint-N folder to resume_from_checkpoint"
        ) from None


class ShardstreamTrainer(ShardstreamTrainerMixin, Trainer):  # type: ignore[misc]
    """``transformers.Trainer`` trained from a :class:`ShardstreamLoader`
    (see :class:`ShardstreamTrainerMixin` and the module doc)."""
