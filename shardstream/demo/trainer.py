"""The demo's training job: a tiny next-token model fed by :class:`ShardstreamLoader`.

Run as ``python -m shardstream.demo.trainer``. Every step appends ``step loss ids`` to the
log (the ids of the samples the step consumed). Every ``--commit-every`` steps it commits the
loader's state to the server *then* saves the model, so the model checkpoint's step always
has a data state on the server; ``--resume`` loads the newest model checkpoint and asks the
server for the data state at that step. With ``--epoch-log`` it also logs ``step ids`` of
every batch of the first epoch, reading on without training once its steps are done: the
whole epoch's order, which the demo's elastic resume is checked against.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch import nn

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    ServerOptions,
    ShardstreamLoader,
    StreamingDataset,
)

BATCH_SIZE = 32
SEED = 7


class TinyLM(nn.Module):
    """Embedding, one hidden layer, next-token logits: enough to show a falling loss."""

    def __init__(self, vocab: int, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(self.embed(tokens))))  # type: ignore[no-any-return]


def _latest_model(ckpt_dir: Path) -> tuple[int, Path] | None:
    steps = [(int(p.stem.split("-")[1]), p) for p in ckpt_dir.glob("model-*.pt")]
    return max(steps) if steps else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--commit-every", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--epoch-log", type=Path)
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same arithmetic in every run, so losses match too
    model = TinyLM(args.vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    dataset = StreamingDataset(
        args.dataset,
        BATCH_SIZE,
        plan=PlanOptions(seed=SEED),
        cache=CacheOptions(dir=args.cache_dir),
        decode=DecodeOptions(sample_ids=True),
        server=ServerOptions(run=args.run),  # URL and token from SHARDSTREAM_SERVER/_TOKEN
    )
    step, resume = 0, None
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    if args.resume and (latest := _latest_model(args.ckpt_dir)) is not None:
        step, path = latest
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        resume = step  # the data state committed at the model's step
    with (
        ShardstreamLoader(dataset, num_workers=2, resume=resume) as loader,
        open(args.log, "a", encoding="utf-8") as log,
        open(args.epoch_log or os.devnull, "a", encoding="utf-8") as epoch_log,
    ):
        first_epoch = len(loader)  # batches in epoch 0 (a fresh run starts there)
        while step < args.steps:
            for batch in loader:
                step += 1
                tokens = batch["tokens"].long()
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
                )
                optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                ids = ",".join(str(i) for i in batch["sample_id"].tolist())
                log.write(f"{step} {loss.item():.6f} {ids}\n")
                log.flush()
                if step <= first_epoch:
                    epoch_log.write(f"{step} {ids}\n")
                if step % args.commit_every == 0:
                    loader.commit(step, wait=True)  # durable before the model marks the step
                    tmp = args.ckpt_dir / f".model-{step}.tmp"
                    torch.save(
                        {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp
                    )
                    os.replace(tmp, args.ckpt_dir / f"model-{step}.pt")
                if step >= args.steps:
                    break
        if args.epoch_log is not None and step < first_epoch:
            for batch in loader:  # the rest of epoch 0, without training
                step += 1
                ids = ",".join(str(i) for i in batch["sample_id"].tolist())
                epoch_log.write(f"{step} {ids}\n")


if __name__ == "__main__":
    main()
