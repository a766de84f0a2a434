"""shardstream under MosaicML Composer's calling convention: the position rides in Composer's
checkpoint through ``dataset.state_dict(num_samples, from_beginning)`` and comes back through
``dataset.load_state_dict(obj)``; a job saved on 2 ranks resumes exactly on 3.

mosaicml (0.32) pins torch < 2.7.1, so it cannot be installed beside this project's torch.
:class:`ComposerStandIn` calls the train dataloader exactly as Composer 0.32.1 does (source
read from its wheel): ``State._dataset_of`` (``composer/core/state.py``: a ``DataLoader``'s
``.dataset``, else nothing is saved), ``State._dataset_state_dict`` (``state_dict(int(
timestamp.sample_in_epoch), True)`` into ``dataset_state['train']``), the
``train_dataloader`` setter (``load_state_dict(dataset_state['train'])`` and
``dataset_resumption['train'] = True``), and the trainer's epoch loop
(``composer/trainer/trainer.py``: ``for batch in dataloader`` each epoch, skipping the
epoch's first ``batch_in_epoch`` batches unless ``'train' in dataset_resumption``;
``sample_in_epoch`` summed over the ranks). The ranks are in-process loaders with their own
``Topology``: no ``torch.distributed`` is needed to read as rank r of W.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

from shardstream.client import (
    DecodeOptions,
    PlanOptions,
    ShardstreamLoader,
    StreamingDataset,
    Topology,
)
from shardstream.errors import ResumeError
from shardstream.integrations.composer import composer_dataloader
from tests.client.integrations.launch import plan_batches, write_random_tokens

GLOBAL_BATCH = 12
SEED = 7


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """96 samples of 8 token ids: 8 global batches an epoch."""
    out = tmp_path_factory.mktemp("composer") / "tokens"
    return str(write_random_tokens(out, 96, 8, size_limit=400, seed=2))


def _dataloaders(tokens: str, world: int) -> list[torch.utils.data.DataLoader[Any]]:
    def rank(r: int) -> torch.utils.data.DataLoader[Any]:
        dataset = StreamingDataset(
            tokens, GLOBAL_BATCH // world, plan=PlanOptions(seed=SEED),
            decode=DecodeOptions(sample_ids=True), topology=Topology(rank=r, world_size=world),
        )  # fmt: skip
        return composer_dataloader(ShardstreamLoader(dataset, num_workers=0, stats=False))

    return [rank(r) for r in range(world)]


class ComposerStandIn:
    """Composer's ``State``/``Trainer`` as far as they touch the train dataloader (see the
    module doc), one dataloader per rank, iterated in step."""

    def __init__(self, dataloaders: list[Any], checkpoint: dict[str, Any] | None = None) -> None:
        self.dataloaders = dataloaders
        self.epoch = self.batch = self.batch_in_epoch = self.sample_in_epoch = 0
        self.dataset_resumption: dict[str, Any] = {}
        if checkpoint is not None:  # State.load_state_dict, then the train_dataloader setter
            stamp = checkpoint["timestamp"]
            self.epoch, self.batch = stamp["epoch"], stamp["batch"]
            self.batch_in_epoch = stamp["batch_in_epoch"]
            self.sample_in_epoch = stamp["sample_in_epoch"]
            for loader in dataloaders:  # every rank loads the same (rank 0's) checkpoint
                dataset = self._dataset_of(loader)
                if hasattr(dataset, "load_state_dict"):
                    dataset.load_state_dict(checkpoint["dataset_state"]["train"])
                    self.dataset_resumption["train"] = True

    @staticmethod
    def _dataset_of(loader: Any) -> Any:
        return loader.dataset if isinstance(loader, torch.utils.data.DataLoader) else None

    def checkpoint(self) -> dict[str, Any]:
        """What rank 0 saves (``State._dataset_state_dict`` + the timestamp), through
        ``torch.save``/``torch.load`` as Composer writes it."""
        dataset = self._dataset_of(self.dataloaders[0])
        train = dataset.state_dict(int(self.sample_in_epoch), True)
        stamp = {
            "epoch": self.epoch, "batch": self.batch, "batch_in_epoch": self.batch_in_epoch,
            "sample_in_epoch": self.sample_in_epoch,
        }  # fmt: skip
        body = {"timestamp": stamp, "dataset_state": {"train": train, "eval": {}}}
        buffer = io.BytesIO()
        torch.save(body, buffer)
        buffer.seek(0)
        loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
        return loaded

    def fit(
        self, max_batches: int, on_save: Callable[[int, dict[str, Any]], None], every: int
    ) -> dict[int, list[int]]:
        """Train to ``max_batches`` (Composer's ``batch`` count); returns ``{step: global
        batch's sample ids, sorted}``; ``on_save(step, checkpoint)`` every ``every`` steps."""
        seen: dict[int, list[int]] = {}
        while self.batch < max_batches:
            for index, batches in enumerate(zip(*self.dataloaders, strict=True)):
                if "train" not in self.dataset_resumption and index < self.batch_in_epoch:
                    continue  # Composer's spin through the epoch's trained batches
                ids = sorted(i for b in batches for i in b["sample_id"].tolist())
                self.batch += 1
                self.batch_in_epoch += 1
                self.sample_in_epoch += len(ids)  # summed over the ranks
                seen[self.batch] = ids
                if self.batch % every == 0:
                    on_save(self.batch, self.checkpoint())
                if self.batch == max_batches:
                    return seen
            self.epoch, self.batch_in_epoch, self.sample_in_epoch = self.epoch + 1, 0, 0
        return seen


def test_composer_checkpoint_saved_on_2_ranks_resumes_exactly_on_3(tokens: str) -> None:
    reference = plan_batches(tokens, GLOBAL_BATCH, 11, SEED)
    saved: dict[int, dict[str, Any]] = {}
    first = ComposerStandIn(_dataloaders(tokens, 2)).fit(6, saved.__setitem__, every=4)
    assert first == {s: reference[s] for s in range(1, 7)}  # then the job dies at step 6
    train = saved[4]["dataset_state"]["train"]
    assert (train["shardstream"]["epoch"], train["shardstream"]["batch"]) == (0, 4)
    assert train["num_samples"] == 4 * GLOBAL_BATCH

    resumed = ComposerStandIn(_dataloaders(tokens, 3), saved[4])
    assert resumed.fit(11, lambda *_: None, every=100) == {s: reference[s] for s in range(5, 12)}


def test_state_saved_at_an_epoch_end_resumes_at_the_next_epoch(tokens: str) -> None:
    reference = plan_batches(tokens, GLOBAL_BATCH, 10, SEED)
    saved: dict[int, dict[str, Any]] = {}
    ComposerStandIn(_dataloaders(tokens, 2)).fit(8, saved.__setitem__, every=8)
    position = saved[8]["dataset_state"]["train"]["shardstream"]
    assert (position["epoch"], position["batch"]) == (1, 0)
    resumed = ComposerStandIn(_dataloaders(tokens, 2), saved[8])
    assert resumed.fit(10, lambda *_: None, every=100) == {9: reference[9], 10: reference[10]}


def test_a_dataset_state_of_another_loader_is_refused(tokens: str) -> None:
    foreign = {"epoch": 0, "sample_in_epoch": 48, "num_canonical_nodes": 1, "shuffle_seed": 9}
    (loader,) = _dataloaders(tokens, 1)
    with pytest.raises(ResumeError, match=r"not saved by shardstream's composer_dataloader"):
        loader.dataset.load_state_dict(foreign)  # type: ignore[attr-defined]
