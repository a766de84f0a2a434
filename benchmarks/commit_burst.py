"""A checkpoint of a 4,096-rank job: every rank commits at once. How long until every
rank's commit is durable, and how long is a rank's training step blocked?

``--ranks`` simulated ranks (default 4,096), each on its own keep-alive connection, are
spread over ``--processes`` load-generator processes (raw HTTP/1.1 on uvloop, like
``server_load.py``); the 8 ranks of a node share a run and commit the same state (one
new checkpoint and 7 idempotent replays per node, as when every rank calls
``loader.commit(step)``). All start at one agreed moment; each rank's commit is durable
when its answer (201 or 200) arrives.

Beside them, ``--sdk-ranks`` ranks in the parent process commit through the client SDK's
:class:`~shardstream.client.committer.CheckpointCommitter` (a background thread and a
connection each, as in separate training processes): the time ``submit`` took is how
long the rank's step was blocked; the time until its future is done, its durability.

    python benchmarks/commit_burst.py                           # 4,096 ranks, both databases
    python benchmarks/commit_burst.py --ranks 512 --backends sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
from _rawhttp import RawClient
from server_load import RANKS_PER_NODE, _seed, add_server_arguments, bench_server

try:
    import uvloop
except ImportError:  # pragma: no cover - installed with uvicorn[standard]
    uvloop = None  # type: ignore[assignment]


def _body(step: int) -> bytes:
    return json.dumps(
        {"step": step, "epoch": 0, "sample_in_epoch": step * 256, "plan": {"p": 8}}
    ).encode()


async def _ranks(
    port: int, token: str, ranks: list[tuple[int, int]], step: int, start_at: float
) -> list[tuple[float, int]]:
    """Commit for every ``(rank, run)`` at ``start_at`` (wall clock); (seconds, status)."""
    headers = {"Authorization": f"Bearer {token}"}
    clients = [RawClient("127.0.0.1", port, headers) for _ in ranks]
    for client in clients:  # connections open before the burst, like a running job's
        await client.request("GET", "/healthz")
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one(client: RawClient, run: int) -> tuple[float, int]:
        try:
            response = await client.request("POST", f"/v1/runs/{run}/checkpoints", _body(step))
            status = response.status
        except OSError as exc:
            status = -abs(exc.errno or 1)
        return time.time() - start_at, status

    results = await asyncio.gather(
        *(one(c, run) for c, (_, run) in zip(clients, ranks, strict=True))
    )
    for client in clients:
        await client.close()
    return list(results)


def _process_main(
    port: int, token: str, ranks: list[tuple[int, int]], step: int, start_at: float, out: str
) -> None:
    if uvloop is not None:
        uvloop.install()
    results = asyncio.run(_ranks(port, token, ranks, step, start_at))
    Path(out).write_text(json.dumps(results))


def _sdk_ranks(
    base: str, token: str, runs: list[int], step: int, start_at: float
) -> tuple[list[float], list[float]]:
    """Commits through CheckpointCommitter: (seconds blocked in submit, seconds to durable)."""
    from shardstream.client.committer import CheckpointCommitter

    committers = [CheckpointCommitter(base, token) for _ in runs]
    for committer in committers:  # connected, as after a job's first commit
        committer.api.healthz()
    time.sleep(max(0.0, start_at - time.time()))
    blocked, futures = [], []
    for committer, run in zip(committers, runs, strict=True):
        t = time.time()
        futures.append(
            committer.submit(run, step=step, epoch=0, sample_in_epoch=step * 256, plan={"p": 8})
        )
        blocked.append(time.time() - t)
    durable = []
    for future in futures:
        future.result()
        durable.append(time.time() - start_at)
    for committer in committers:
        committer.close()
    return blocked, durable


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, float]:
    """One burst against a fresh server on ``backend``."""
    with bench_server(backend, args, "burst") as srv:
        tmp, port, base = srv.tmp, srv.port, srv.base
        admin = srv.admin_token
        seed = argparse.Namespace(shards=8, ranks=args.ranks + args.sdk_ranks * RANKS_PER_NODE)
        token, runs = _seed(base, admin, tmp / "shards", seed)
        raw = [(r, runs[r // RANKS_PER_NODE]) for r in range(args.ranks)]
        sdk_runs = runs[-(-args.ranks // RANKS_PER_NODE) :][: args.sdk_ranks]
        start_at = time.time() + args.warmup_s + args.ranks / 2000
        ctx = mp.get_context("spawn")
        outs = [str(tmp / f"burst-{p}.json") for p in range(args.processes)]
        procs = [
            ctx.Process(
                target=_process_main,
                args=(port, token, raw[p :: args.processes], 1, start_at, outs[p]),
            )
            for p in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        blocked, sdk_durable = _sdk_ranks(base, token, sdk_runs, 1, start_at)
        for proc in procs:
            proc.join()
        results = [tuple(r) for out in outs for r in json.loads(Path(out).read_text())]
        seconds = np.array([s for s, _ in results] + sdk_durable)
        statuses = [status for _, status in results]
        blocked_ms = np.array(blocked) * 1000
        return {
            "ranks": float(len(seconds)),
            "all durable s": float(seconds.max()),
            "durable p50 ms": float(np.percentile(seconds, 50) * 1000),
            "durable p99 ms": float(np.percentile(seconds, 99) * 1000),
            "201 new": float(statuses.count(201)),
            "200 replay": float(statuses.count(200)),
            "errors": float(sum(1 for s in statuses if s not in (200, 201))),
            "SDK ranks": float(len(blocked)),
            "step blocked p50 ms": float(np.percentile(blocked_ms, 50)),
            "step blocked max ms": float(blocked_ms.max()),
            "SDK durable max s": float(max(sdk_durable)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=4096, help="raw-HTTP ranks")
    parser.add_argument("--sdk-ranks", type=int, default=32, help="ranks through the SDK")
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="time to connect first")
    add_server_arguments(parser)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {b: run_backend(b, args) for b in backends}
    print(
        f"\ncommit_burst: {args.ranks} ranks in {args.processes} processes + "
        f"{args.sdk_ranks} through the SDK, {os.cpu_count()} CPUs"
    )
    print(f"{'metric':<24}" + "".join(f"{b:>14}" for b in backends))
    for metric in results[backends[0]]:
        print(f"{metric:<24}" + "".join(f"{results[b][metric]:>14.1f}" for b in backends))


if __name__ == "__main__":
    main()
