"""One rank of a Hugging Face ``Trainer`` job on shardstream: ``python -m
tests.client.integrations.hf_job CONFIG.json`` (rank and world size from the environment,
as under ``torchrun``; the Trainer's accelerate state joins a gloo group on loopback).

A tiny random-init GPT-2 trains on token ids; every step appends ``step id id ...`` (the
sample ids this rank trained on) to ``rank{R}.log``. With ``hang_at``, each rank stops
before training that step, writes ``hang{R}`` and waits to be killed: a deterministic
point for the test's SIGKILL, after the checkpoints before it are complete.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch


def _cpu_index_restores() -> None:
    """transformers 4.57 loads the optimizer of a DDP rank with ``map_location=args.device``,
    on CPU ``cpu:0``, which torch 2.14 does not restore to (a CPU-only DDP resume fails in
    ``Trainer._load_optimizer_and_scheduler``, data or not): restore ``cpu:N`` as ``cpu``."""

    def restore(obj: Any, location: str) -> Any:
        return obj if location.startswith("cpu:") else None

    torch.serialization.register_package(5, lambda obj: None, restore)


def preload() -> None:
    """The heavy imports, done once by the launcher before it forks the ranks
    (:mod:`tests.client.integrations.fork_ranks`)."""
    import transformers.models.gpt2  # noqa: F401
    from transformers import Trainer  # noqa: F401

    import shardstream.integrations.hf_trainer  # noqa: F401


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    torch.set_num_threads(1)
    _cpu_index_restores()
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset
    from shardstream.integrations.hf_trainer import ShardstreamTrainer

    rank = int(os.environ.get("RANK", "0"))
    attempt = Path(cfg["attempt"])
    log = (attempt / f"rank{rank}.log").open("a", buffering=1)

    def to_inputs(batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["tokens"].long()
        return {"input_ids": ids, "labels": ids, "sample_id": batch["sample_id"]}

    class LoggedTrainer(ShardstreamTrainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kw: Any) -> Any:
            step = self.state.global_step + 1
            if step == cfg.get("hang_at"):
                (attempt / f"hang{rank}").write_text(str(step))
                while True:
                    time.sleep(1)
            ids = inputs.pop("sample_id").tolist()
            log.write(f"{step} {' '.join(map(str, ids))}\n")
            return super().compute_loss(model, inputs, *args, **kw)

    dataset = StreamingDataset(
        cfg["data"],
        cfg["batch_size"],
        plan=PlanOptions(seed=cfg["seed"]),
        decode=DecodeOptions(sample_ids=True),
        transform=to_inputs,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    )
    args = TrainingArguments(
        cfg["output_dir"],
        max_steps=cfg["max_steps"],
        save_steps=cfg["save_steps"],
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        logging_steps=1000,
        disable_tqdm=True,
        dataloader_num_workers=1,
    )
    trainer = LoggedTrainer(model=model, args=args, train_dataset=dataset)
    trainer.train(resume_from_checkpoint=cfg.get("resume") or None)
    (attempt / f"done{rank}").write_text("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
