"""One rank of a bare ``accelerate`` loop on shardstream: ``python -m
tests.client.integrations.accelerate_job CONFIG.json`` (rank and world size from the
environment, as under ``torchrun``; gloo on loopback).

A tiny model trains on token ids; ``accelerator.save_state`` every ``save_steps`` into
``out/step-N`` (the step in ``step.txt`` beside it); ``resume`` loads the newest. Every step
appends ``step id id ...`` to ``rank{R}.log``; ``hang_at`` stops before that step (see
:mod:`tests.client.integrations.hf_job`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch


def preload() -> None:
    """The heavy imports, done once by the launcher before it forks the ranks
    (:mod:`tests.client.integrations.fork_ranks`)."""
    import accelerate  # noqa: F401
    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: 3-30 s per rank)

    import shardstream.integrations.hf_accelerate  # noqa: F401


def main(config_path: str) -> int:
    cfg = json.loads(Path(config_path).read_text())
    os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    torch.set_num_threads(1)
    from accelerate import Accelerator, DataLoaderConfiguration

    from shardstream.client import DecodeOptions, PlanOptions, ShardstreamLoader, StreamingDataset
    from shardstream.integrations.hf_accelerate import prepare_loader

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(dispatch_batches=False)
    )
    rank = accelerator.process_index
    attempt, out = Path(cfg["attempt"]), Path(cfg["output_dir"])
    log = (attempt / f"rank{rank}.log").open("a", buffering=1)
    dataset = StreamingDataset(
        cfg["data"], cfg["batch_size"], plan=PlanOptions(seed=cfg["seed"]),
        decode=DecodeOptions(sample_ids=True),
    )  # fmt: skip
    loader = prepare_loader(accelerator, ShardstreamLoader(dataset, num_workers=1))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 16), torch.nn.Linear(16, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    step = 0
    if cfg.get("resume"):
        newest = max(out.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        accelerator.load_state(str(newest))
        step = int((newest / "step.txt").read_text())
    while step < cfg["max_steps"]:
        for batch in loader:
            step += 1
            if step == cfg.get("hang_at"):
                (attempt / f"hang{rank}").write_text(str(step))
                while True:
                    time.sleep(1)
            log.write(f"{step} {' '.join(map(str, batch['sample_id'].tolist()))}\n")
            tokens = batch["tokens"].long()
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if step % cfg["save_steps"] == 0:
                folder = out / f"step-{step}"
                accelerator.save_state(str(folder))
                if accelerator.is_main_process:
                    (folder / "step.txt").write_text(str(step))
                accelerator.wait_for_everyone()
            if step == cfg["max_steps"]:
                break
    (attempt / f"done{rank}").write_text("ok")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
