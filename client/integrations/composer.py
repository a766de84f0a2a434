"""MosaicML Composer on a :class:`ShardstreamLoader`: its checkpoints carry our position.

Composer saves a train dataset's position only for a ``torch`` ``DataLoader`` whose
``dataset`` has MosaicML Streaming's signature: at every checkpoint it calls
``dataloader.dataset.state_dict(num_samples, from_beginning=True)`` (``num_samples``: the
global samples of the current epoch, its ``timestamp.sample_in_epoch``), stores the result
in the checkpoint, and on resume calls ``dataset.load_state_dict(obj)`` as the dataloader is
set; it then skips nothing (``dataset_resumption``), where it would otherwise spin the
loader through every batch already trained. So :func:`composer_dataloader` returns that
``DataLoader``: a shell whose ``dataset`` (:class:`ComposerDataset`) speaks Composer's
calls and whose batches come from the :class:`ShardstreamLoader` (its fast workers, its
count of what the training loop consumed).

The saved position is the loader's own (the global batches the loop consumed), and it is a
global position: a job saved on 2 ranks resumes on 3 with the same global batch. Composer's
``num_samples`` is kept beside it for the record; it is not trusted as the position (it
counts rows of whatever a batch holds, which for packed rows is not documents).

mosaicml 0.32 pins torch < 2.7.1 and so cannot be installed beside this project's torch:
this module imports nothing of Composer, and its test calls it as Composer's ``State`` does.

>>> train_dataloader = composer_dataloader(ShardstreamLoader(dataset))   # doctest: +SKIP
>>> Trainer(model=model, train_dataloader=train_dataloader, save_folder=...)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from shardstream.client.loader import ShardstreamLoader
from shardstream.errors import ResumeError

__all__ = ["ComposerDataset", "composer_dataloader"]

STATE_KEY = "shardstream"


class ComposerDataset(torch.utils.data.IterableDataset[dict[str, Any]]):
    """The dataset Composer sees: a :class:`ShardstreamLoader`'s batches and position, behind
    MosaicML Streaming's ``state_dict(num_samples, from_beginning)``/``load_state_dict(obj)``."""

    def __init__(self, loader: ShardstreamLoader) -> None:
        super().__init__()
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The loader's position (what the training loop consumed), as Composer stores it.

        ``num_samples``/``from_beginning`` are Composer's count of the epoch's samples; it
        is recorded, not used: the loader counts the batches the loop took itself."""
        return {
            STATE_KEY: self.loader.state_dict(),
            "num_samples": int(num_samples),
            "from_beginning": bool(from_beginning),
        }

    def load_state_dict(self, obj: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict` saved in a Composer checkpoint (O(1): nothing is
        replayed); refused, naming the difference, if its order is not this loader's."""
        if not isinstance(obj, Mapping) or STATE_KEY not in obj:
            keys = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
            raise ResumeError(
                "the Composer checkpoint's train dataset state was not saved by shardstream's "
                f"composer_dataloader (it has {keys}, not {STATE_KEY!r}): a dataset state from "
                "another loader cannot position this one; resume from a checkpoint of this job"
            )
        self.loader.load_state_dict(obj[STATE_KEY])


def composer_dataloader(loader: ShardstreamLoader) -> torch.utils.data.DataLoader[Any]:
    """A ``DataLoader`` for ``Trainer(train_dataloader=...)`` whose batches are ``loader``'s
    and whose ``dataset`` saves and restores its position in Composer's checkpoints."""
    return torch.utils.data.DataLoader(ComposerDataset(loader), batch_size=None, num_workers=0)
