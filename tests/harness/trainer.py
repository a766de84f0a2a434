"""The training loop one rank runs: ``python -m tests.harness.trainer <attempt>/config.json``.

It behaves like a DDP training script under ``torchrun``: rank and world size come from
``RANK``/``WORLD_SIZE`` (``MASTER_ADDR``/``MASTER_PORT`` for ``env://``), it joins a gloo
process group, builds the shardstream loader with ``num_workers`` DataLoader workers and
runs one epoch. Every step it

1. takes the next batch and all-gathers ``(step, batch size)`` across ranks: that is the
   collective a real DDP backward performs, so ranks that disagree on the number of steps
   block there, and the collective timeout turns that hang into a failure;
2. appends the batch's sample ids to the rank's log (see :mod:`tests.harness.records`);
3. every ``checkpoint_every`` steps saves ``loader.state_dict()`` to its per-rank checkpoint
   file (atomically) and, with ``commit``, once every rank has saved, calls
   ``loader.commit(step)`` on rank 0 (every rank with ``commit_all_ranks``), so the
   server's newest step is never ahead of the newest checkpoint all ranks completed.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from tests.harness.config import TrainerConfig
from tests.harness.loaders import batch_ids, build_loader, packed_rows
from tests.harness.records import (
    StepLogWriter,
    checkpoint_path,
    done_path,
    load_checkpoint,
    log_path,
    rows_log_path,
    save_checkpoint,
)

_STEP, _END, _SAVED = 0, 1, 2  # tags of the collectives


def _sync(tag: int, step: int, size: int, world_size: int) -> None:
    """All-gather ``(tag, step, size)`` and fail unless every rank sent the same thing."""
    mine = torch.tensor([tag, step, size], dtype=torch.int64)
    everyone = [torch.zeros(3, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(everyone, mine)
    seen = {tuple(t.tolist()) for t in everyone}
    if len(seen) != 1:
        raise RuntimeError(f"ranks out of step: (tag, step, batch size) per rank = {seen}")


def run(cfg: TrainerConfig, rank: int, world_size: int) -> None:
    """Run one epoch as rank ``rank`` of ``world_size`` (the process group is initialized)."""
    attempt = Path(cfg.attempt_dir)
    loader = build_loader(cfg, rank, world_size)
    step = 0
    if cfg.resume_state_dict is not None:
        old = cfg.resume_state_dict
        ckpt = load_checkpoint(
            checkpoint_path(Path(old.attempt_dir), old.step, rank % old.world_size)
        )
        if ckpt["step"] != old.step:
            raise RuntimeError(f"checkpoint file says step {ckpt['step']}, expected {old.step}")
        if old.model_step is None:
            loader.load_state_dict(ckpt["loader"])
            step = old.step
        else:
            from shardstream.client.loader import ShardstreamLoader

            assert isinstance(loader, ShardstreamLoader), "model_step needs the real loader"
            loader.load_state_dict(ckpt["loader"], step=old.model_step)
            step = old.model_step
    elif cfg.resume_server is not None:
        # The loader loaded the committed state when it was built; its position in global
        # batches is the step this one-epoch loop resumes after.
        position = loader.state_dict()
        if position["epoch"] != 0:
            raise RuntimeError(f"resumed into epoch {position['epoch']}, expected epoch 0")
        step = int(position["batch"])

    table = None if cfg.data.expected_tokens is None else np.load(cfg.data.expected_tokens)
    log = StepLogWriter(log_path(attempt, rank))
    rows_log = StepLogWriter(rows_log_path(attempt, rank)) if cfg.data.pack else None
    try:
        for batch in loader:
            step += 1
            ids = batch_ids(batch, table)
            _sync(_STEP, step, len(ids), world_size)
            rows = packed_rows(batch)
            if rows_log is not None and rows is not None:
                rows_log.append(step, rows)  # before the ids: a logged step has its rows
            log.append(step, ids)
            if cfg.step_sleep_s:
                time.sleep(cfg.step_sleep_s)
            while step == cfg.hold_after_step:
                time.sleep(1.0)  # wait for the SIGKILL
            if step % cfg.checkpoint_every == 0:
                state = {"step": step, "rank": rank, "world_size": world_size}
                save_checkpoint(
                    checkpoint_path(attempt, step, rank), {**state, "loader": loader.state_dict()}
                )
                if cfg.commit:
                    # Like a trainer, publish a checkpoint only once every rank has
                    # written its part; then rank 0 commits (or every rank, the same
                    # state: re-committing a step with the same state is a no-op).
                    _sync(_SAVED, step, 0, world_size)
                    if rank == 0 or cfg.commit_all_ranks:
                        loader.commit(step)
        # The epoch's end is a collective too: a rank that ran out of batches early meets
        # the others' step collective here and fails instead of hanging.
        _sync(_END, step, 0, world_size)
    finally:
        log.close()
        if rows_log is not None:
            rows_log.close()
        loader.close()
    done_path(attempt, rank).write_text(f"{step}\n")


def main(argv: list[str]) -> int:
    """Entry point: ``argv[1]`` is the path of the attempt's config JSON."""
    cfg = TrainerConfig.read(Path(argv[1]))
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # many ranks share few cores
    dist.init_process_group(
        backend="gloo",
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=cfg.collective_timeout_s),
    )
    try:
        run(cfg, rank, world_size)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
