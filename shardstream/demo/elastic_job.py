"""The demo's data-parallel job: ``--world-size`` ranks, each a node with its own cache.

Run as ``python -m shardstream.demo.elastic_job``. Like ``torchrun`` it starts one process
per rank, but forks them from one parent that has imported torch already, so a 4-rank job
costs one torch import, not four (the demo runs on laptops and 2-core CI machines). The
ranks join a gloo process group on 127.0.0.1; their loader workers fork from them, so the
whole job is one process group that one SIGKILL takes down.

Each rank reads one epoch with its share of every global batch and appends ``step ids``
to ``rank<r>.log``. Every ``--commit-every`` steps the ranks meet in a barrier, as ranks
saving a distributed checkpoint do, and then rank 0 commits the data position to the
server: every rank has consumed that step by then. The ranks read and do not train: an
epoch of training would take the demo minutes, and the claim shown here is the data's.
``--hold-at`` parks the ranks at a step, so the demo's SIGKILL lands mid-epoch however
fast they read; ``--resume`` starts from the run's latest checkpoint on the server.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    ServerOptions,
    ShardstreamLoader,
    StreamingDataset,
)
from shardstream.demo.run import free_port
from shardstream.demo.trainer import SEED


def _rank_main(args: argparse.Namespace, rank: int, init: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world_size)
    dataset = StreamingDataset(  # rank and world size come from the process group
        args.dataset,
        args.global_batch // args.world_size,  # the same global batch on any number of ranks
        plan=PlanOptions(seed=SEED),  # default options: nobody plans a resize in advance
        cache=CacheOptions(dir=args.cache_dir / f"node{rank}"),
        decode=DecodeOptions(sample_ids=True),
        server=ServerOptions(run=args.run),  # URL and token from SHARDSTREAM_SERVER/_TOKEN
    )
    with (
        ShardstreamLoader(
            dataset, num_workers=args.workers, resume="latest" if args.resume else None
        ) as loader,
        open(args.log_dir / f"rank{rank}.log", "a", encoding="utf-8") as log,
    ):
        step = loader.state_dict()["batch"]  # global batches consumed: 0 or the checkpoint's
        for batch in loader:
            step += 1
            log.write(f"{step} {','.join(str(i) for i in batch['sample_id'].tolist())}\n")
            log.flush()
            if step % args.commit_every == 0:
                dist.barrier()
                if rank == 0:
                    loader.commit(step)
            if step == args.hold_at:
                while True:  # until the demo's SIGKILL
                    time.sleep(1)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--workers", type=int, required=True, help="loader workers per rank")
    parser.add_argument("--commit-every", type=int, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--hold-at", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)

    init = f"tcp://127.0.0.1:{free_port()}"  # the job's rendezvous stays on loopback
    ctx = mp.get_context("fork")
    ranks = [ctx.Process(target=_rank_main, args=(args, r, init)) for r in range(args.world_size)]
    for proc in ranks:
        proc.start()
    running = {proc.sentinel: rank for rank, proc in enumerate(ranks)}
    failed = 0
    while running:
        ended = wait(list(running))  # whichever rank ends first
        for sentinel in [s for s in running if s in ended]:
            rank = running.pop(sentinel)
            ranks[rank].join()
            if ranks[rank].exitcode != 0 and not failed:
                failed = 1
                print(f"rank {rank} exited with {ranks[rank].exitcode}", file=sys.stderr)
                for other in ranks:  # the others would wait for it in the next barrier
                    other.kill()
    return failed


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skips tearing down torch's modules: a second or more of a short demo
