"""shardstream in PyTorch Lightning (2.6): ``ShardstreamCheckpoint`` keeps the position of the
batch the model trained on in Lightning's checkpoint, and a resume reads exactly the plan's
sequence, mid-epoch under ``max_steps`` and from an epoch's end under ``max_epochs`` (the
configuration in which Lightning drops a train iterable's own state: pytorch-lightning
#20550); a bare ``ShardstreamLoader`` is refused."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from shardstream.errors import ConfigError
from tests.client.integrations.launch import plan_batches, write_random_tokens

BATCH = 16
SEED = 3


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """64 samples: 4 batches an epoch."""
    out = tmp_path_factory.mktemp("lightning") / "tokens"
    return str(write_random_tokens(out, 64, 8, size_limit=300, seed=4) / "index.json")


def _fit(
    tokens: str, root: Path, ckpt: str | None, bare: bool = False, **limits: Any
) -> dict[int, list[int]]:
    """Fit a tiny module; returns ``{global step: its sample ids, sorted}``."""
    import lightning as L

    from shardstream.client import DecodeOptions, PlanOptions, ShardstreamLoader, StreamingDataset
    from shardstream.integrations.lightning import ShardstreamCheckpoint

    checkpoint = ShardstreamCheckpoint()
    seen: dict[int, list[int]] = {}

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(1, 1)

        def train_dataloader(self) -> Any:
            dataset = StreamingDataset(
                tokens, BATCH, plan=PlanOptions(seed=SEED), decode=DecodeOptions(sample_ids=True)
            )
            loader = ShardstreamLoader(dataset, num_workers=0, stats=False)
            return loader if bare else checkpoint.wrap(loader)

        def training_step(self, batch: dict[str, Any], index: int) -> Any:
            seen[self.global_step + 1] = sorted(batch["sample_id"].tolist())
            return self.net(torch.ones(1, 1)).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    saver = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=root, every_n_train_steps=3, save_top_k=-1, filename="{step}"
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[checkpoint, saver], **limits,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), ckpt_path=ckpt)
        trainer.save_checkpoint(root / "end.ckpt")
    return seen


def test_mid_epoch_checkpoint_resumes_exactly_across_an_epoch_end(
    tokens: str, tmp_path: Path
) -> None:
    reference = plan_batches(tokens, BATCH, 10, SEED)
    first = _fit(tokens, tmp_path, None, max_steps=5)
    assert first == {s: reference[s] for s in range(1, 6)}
    # step=3.ckpt was saved while Lightning had fetched batch 4 already: its position is 3's
    resumed = _fit(tokens, tmp_path / "again", str(tmp_path / "step=3.ckpt"), max_steps=10)
    assert resumed == {s: reference[s] for s in range(4, 11)}


def test_epoch_end_checkpoint_under_max_epochs_resumes_at_the_next_epoch(
    tokens: str, tmp_path: Path
) -> None:
    """pytorch-lightning #20550's configuration: Lightning itself would not restore here."""
    reference = plan_batches(tokens, BATCH, 12, SEED)
    assert _fit(tokens, tmp_path, None, max_epochs=2) == {s: reference[s] for s in range(1, 9)}
    resumed = _fit(tokens, tmp_path / "again", str(tmp_path / "end.ckpt"), max_epochs=3)
    assert resumed == {s: reference[s] for s in range(9, 13)}  # epoch 2, not epoch 0 again


def test_a_bare_loader_is_refused_naming_the_lightning_issue(tokens: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"returned a ShardstreamLoader itself.*#20550"):
        _fit(tokens, tmp_path, None, bare=True, max_steps=2)
