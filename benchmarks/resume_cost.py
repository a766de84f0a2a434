"""Resume cost at a late step: the Hugging Face Trainer's replay against shardstream's state.

The ``Trainer`` resumes its data by replaying it: ``skip_first_batches`` reads and throws
away every batch of the current epoch before the checkpoint's step. ``ShardstreamTrainer``
loads a position instead. This measures, for checkpoints at each ``--steps`` (default 1,000
and 10,000, inside the first epoch), the wall time from ``train(resume_from_checkpoint=...)``
to the first trained batch, both ways, on the same data and model, and prints them side by
side with the samples each first batch held (they must be the same batch).

A checkpoint at step N is made cheaply: one real step is trained and saved, then its
``trainer_state.json`` says step N and its ``shardstream_data.json`` holds the position of
step N (the Trainer restores model, optimizer and scheduler the same way at any step).

    python benchmarks/resume_cost.py --steps 1000 10000
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

BATCH = 8
SEQ = 32


def write_tokens(folder: Path, samples: int) -> str:
    from shardstream.mds import MDSWriter

    rng = np.random.default_rng(0)
    with MDSWriter(str(folder), {"tokens": "ndarray:uint16:32"}, size_limit=1 << 20) as out:
        for _ in range(samples):
            out.write({"tokens": rng.integers(0, 256, SEQ, dtype=np.uint16)})
    return str(folder)


def to_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    ids = batch["tokens"].long()
    return {"input_ids": ids, "labels": ids, "sample_id": batch["sample_id"]}


class FirstBatch(Exception):
    """Raised at the first trained batch, to stop the clock and the run."""


def trainer_class(base: type) -> type:
    class Timed(base):  # type: ignore[misc, valid-type]
        def compute_loss(self, model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
            raise FirstBatch(inputs["sample_id"][:4].tolist())

    return Timed


def resume_seconds(shardstream: bool, data: str, checkpoint: Path, out: Path) -> tuple[float, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    dataset = StreamingDataset(
        data, BATCH, plan=PlanOptions(seed=1), decode=DecodeOptions(sample_ids=True),
        transform=to_inputs,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    )
    args = TrainingArguments(
        str(out), max_steps=10**9, save_steps=10**9, use_cpu=True, report_to=[],
        disable_tqdm=True, logging_steps=10**9, dataloader_num_workers=0,
        per_device_train_batch_size=1, remove_unused_columns=False,
    )  # fmt: skip
    cls = trainer_class(ShardstreamTrainer if shardstream else Trainer)
    # The plain Trainer wraps the dataset (whole batches) in a DataLoader of batch_size=1:
    # unwrap the extra dimension with its collator.
    extra = {} if shardstream else {"data_collator": lambda items: items[0]}
    trainer = cls(model=model, args=args, train_dataset=dataset, **extra)
    start = time.perf_counter()
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    except FirstBatch as first:
        return time.perf_counter() - start, first.args[0]
    raise RuntimeError("training ended without a batch")


def make_checkpoint(data: str, root: Path, step: int) -> Path:
    """A Trainer checkpoint that says ``step``, with the data position of ``step``."""
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    out = root / "seed-run"
    if not (out / "checkpoint-1").exists():
        dataset = StreamingDataset(
            data, BATCH, plan=PlanOptions(seed=1), decode=DecodeOptions(sample_ids=True),
            transform=lambda b: {"input_ids": b["tokens"].long(), "labels": b["tokens"].long()},
        )  # fmt: skip
        torch.manual_seed(0)
        model = GPT2LMHeadModel(
            GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
        )
        # per_device_train_batch_size=1: the plain Trainer's "sample" is one whole batch of
        # the dataset, and on resume the Trainer reads its batch size from this checkpoint
        # (trainer_state.json), not from its arguments: with the default 8 it would build a
        # DataLoader of 8 of our batches per step and skip 8 x N of them, not N.
        args = TrainingArguments(
            str(out), max_steps=1, save_steps=1, use_cpu=True, report_to=[], disable_tqdm=True,
            dataloader_num_workers=0, per_device_train_batch_size=1,
        )  # fmt: skip
        ShardstreamTrainer(model=model, args=args, train_dataset=dataset).train()
    folder = root / f"checkpoint-{step}"
    shutil.copytree(out / "checkpoint-1", folder, dirs_exist_ok=True)
    state = json.loads((folder / "trainer_state.json").read_text())
    state["global_step"] = step
    (folder / "trainer_state.json").write_text(json.dumps(state))
    saved = json.loads((folder / "shardstream_data.json").read_text())
    dataset = StreamingDataset(data, BATCH, plan=PlanOptions(seed=1))
    saved["step"] = step
    saved["loader"] = dataset.resume.state(0, step).to_dict()
    (folder / "shardstream_data.json").write_text(json.dumps(saved))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 10000])
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="resume-cost-") as tmp:
        root = Path(tmp)
        data = write_tokens(root / "tokens", BATCH * (max(options.steps) + 50))
        failed = False
        print("| step | Trainer replay (s) | shardstream state (s) | same first batch |")
        print("| ---: | ---: | ---: | --- |")
        for step in options.steps:
            checkpoint = make_checkpoint(data, root, step)
            replay, replay_ids = resume_seconds(False, data, checkpoint, root / "plain")
            ours, our_ids = resume_seconds(True, data, checkpoint, root / "ours")
            print(f"| {step:,} | {replay:.2f} | {ours:.2f} | {replay_ids == our_ids} |")
            if replay_ids != our_ids:
                print(f"step {step}: replay began with {replay_ids}, ours with {our_ids}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
