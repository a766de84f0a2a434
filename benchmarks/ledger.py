"""The cost of the run's ledger (issue 24): a 4,096-rank job whose every rank commits its
loader state at every step, and the audit of a 100,000-step run.

Three figures, per database:

* **commits**: ``--ranks`` simulated ranks (raw HTTP/1.1 keep-alive connections on uvloop,
  spread over ``--processes`` load-generator processes, like ``commit_burst.py``) of one
  registered attempt commit the client's real state (``ReaderState.to_dict()`` with the
  plan, versions and fingerprint, ~0.7 KiB of JSON) at each of ``--steps`` steps, as
  fast as the server answers: per step one new checkpoint and ``ranks - 1`` idempotent
  replays. Reported: requests per second, server (and PostgreSQL) CPU per request, and
  what follows for a 4,096-rank job: the steps per second the server keeps up with.
* **storage**: a run of ``--audit-steps`` checkpoints (20 attempts of shrinking and
  growing world sizes, each resumed from the previous one's last checkpoint) is written
  into the database with the rows the commits above write, and the database's growth is
  extrapolated to a million steps (replays add no rows: a step is one row).
* **audit**: ``GET /v1/runs/{id}/audit`` of that run (the plan's epoch sizes recomputed
  on the server from the 2,000-shard version), which must prove it.

    python benchmarks/ledger.py                                   # the issue's sizes
    python benchmarks/ledger.py --ranks 256 --steps 8 --backends sqlite
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from _rawhttp import RawClient
from server_load import BenchServer, _cpu_seconds, _seed, add_server_arguments, bench_server
from sqlalchemy import Engine, create_engine, insert, text, update

try:
    import uvloop
except ImportError:  # pragma: no cover - installed with uvicorn[standard]
    uvloop = None  # type: ignore[assignment]

GLOBAL_BATCH = 256  # what server_load._seed's runs read
SHARDS = 2000  # of 4,096 samples: 32,000 steps per epoch, 100,000 steps ~ 3 epochs
ATTEMPTS = 20


@functools.cache
def _plan_state() -> tuple[dict[str, Any], str, int]:
    """The plan parameters, fingerprint and batches per epoch of the benchmark's run."""
    import numpy as np

    from shardstream.plan import EpochPlan, PlanConfig, SourceSpec

    config = PlanConfig(seed=0, global_batch_size=GLOBAL_BATCH, num_partitions=64)
    spec = SourceSpec(shard_sizes=np.full(SHARDS, 4096, dtype=np.int64), name="bench@1")
    plan = EpochPlan([spec], config, 0)
    params = {**asdict(config), "mixture": [[None, None, None]]}
    return params, plan.fingerprint, int(plan.num_batches)


def client_state(step: int, world_size: int) -> dict[str, Any]:
    """What the client commits after ``step`` steps (client/_server.py: the state plus
    world size and session), for server_load._seed's version ``bench@1``."""
    from shardstream.client.state import ReaderState
    from shardstream.plan import PLAN_ALGORITHM

    params, fingerprint, per_epoch = _plan_state()
    state = ReaderState(
        step // per_epoch,
        step % per_epoch,
        params,
        ("bench@1",),
        (None,),
        algorithm=PLAN_ALGORITHM,
        fingerprint=fingerprint,
    ).to_dict()
    return {**state, "world_size": world_size, "session": "0123456789abcdef"}


def _commit_body(step: int, state: dict[str, Any], attempt: int) -> bytes:
    return json.dumps(
        {
            "step": step,
            "epoch": state["epoch"],
            "sample_in_epoch": state["samples"],
            "plan": state,
            "attempt": attempt,
        }
    ).encode()


async def _ranks(
    port: int, token: str, run: int, ranks: int, bodies: list[bytes], start_at: float
) -> list[int]:
    """``ranks`` connections, each committing every body in order from ``start_at`` (wall
    clock, once all are connected); the statuses."""
    headers = {"Authorization": f"Bearer {token}"}
    clients = [RawClient("127.0.0.1", port, headers) for _ in range(ranks)]
    for client in clients:  # connected before the clock starts, like a running job's
        await client.request("GET", "/healthz")
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one(client: RawClient) -> list[int]:
        out = []
        for body in bodies:
            try:
                response = await client.request("POST", f"/v1/runs/{run}/checkpoints", body)
                out.append(response.status)
            except OSError as exc:
                out.append(-abs(exc.errno or 1))
        return out

    statuses = await asyncio.gather(*(one(c) for c in clients))
    for client in clients:
        await client.close()
    return [s for rank in statuses for s in rank]


def _process_main(
    port: int, token: str, run: int, ranks: int, bodies: list[bytes], start_at: float, out: str
) -> None:
    if uvloop is not None:
        uvloop.install()
    statuses = asyncio.run(_ranks(port, token, run, ranks, bodies, start_at))
    Path(out).write_text(json.dumps(statuses))


def _register(base: str, token: str, run: int, key: str, world: int, resume: Any) -> int:
    state = client_state(0, world)
    body = {
        "key": key,
        "world_size": world,
        "workers": 4,
        "resume": resume,
        "algorithm": state["algorithm"],
        "fingerprint": state["fingerprint"],
        "changes": [],
    }
    response = httpx.post(
        f"{base}/v1/runs/{run}/attempts",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    response.raise_for_status()
    return int(response.json()["number"])


def _commits(
    base: str, port: int, token: str, run: int, args: argparse.Namespace, cpu: Any
) -> dict[str, float]:
    attempt = _register(base, token, run, "bench-commits", args.ranks, None)
    bodies = [
        _commit_body(s, client_state(s, args.ranks), attempt) for s in range(1, args.steps + 1)
    ]
    tmp = Path(tempfile.mkdtemp(prefix="ss-ledger-"))
    outs = [str(tmp / f"commits-{p}.json") for p in range(args.processes)]
    share = [len(range(p, args.ranks, args.processes)) for p in range(args.processes)]
    ctx = mp.get_context("spawn")
    # Started (and connected) before the clock: spawning imports take seconds here.
    start_at = time.time() + args.warmup_s + args.ranks / 1000
    procs = [
        ctx.Process(
            target=_process_main, args=(port, token, run, share[p], bodies, start_at, outs[p])
        )
        for p in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.time()))
    before = cpu()
    start = time.perf_counter()
    for proc in procs:
        proc.join()
    wall = time.perf_counter() - start
    after = cpu()
    statuses = [s for out in outs for s in json.loads(Path(out).read_text())]
    n = len(statuses)
    result = {
        "ranks": float(args.ranks),
        "steps": float(args.steps),
        "requests": float(n),
        "201 new": float(statuses.count(201)),
        "200 replay": float(statuses.count(200)),
        "errors": float(sum(1 for s in statuses if s not in (200, 201))),
        "requests/s": n / wall,
        "server CPU ms/request": (after["server"] - before["server"]) * 1000 / n,
    }
    if "postgres" in before:
        result["postgres CPU ms/request"] = (after["postgres"] - before["postgres"]) * 1000 / n
    cpu_ms = sum(v for k, v in result.items() if k.endswith("CPU ms/request"))
    result["4096-rank steps/s (wall)"] = result["requests/s"] / 4096
    result["4096-rank steps/CPU-s"] = 1000 / cpu_ms / 4096
    return result


def _db_bytes(engine: Any, backend: str) -> int:
    with engine.connect() as conn:
        if backend == "sqlite":
            pages = conn.execute(text("PRAGMA page_count")).scalar_one()
            free = conn.execute(text("PRAGMA freelist_count")).scalar_one()
            size = conn.execute(text("PRAGMA page_size")).scalar_one()
            return int((pages - free) * size)
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def _write_history(engine: Any, run: int, steps: int, backend: str) -> int:
    """``steps`` checkpoints of run ``run`` in :data:`ATTEMPTS` attempts, as the commits
    and registrations write them; returns the database's growth in bytes."""
    from shardstream.server.models import CheckpointRow, RunAttemptRow, RunRow, utcnow

    worlds = [4096, 2048, 3072, 4096, 1024]
    per = steps // ATTEMPTS
    now = utcnow()
    before = _db_bytes(engine, backend)
    with engine.begin() as conn:
        for a in range(ATTEMPTS):
            world = worlds[a % len(worlds)]
            first, last = a * per + 1, steps if a == ATTEMPTS - 1 else (a + 1) * per
            resumed = None if a == 0 else first - 1
            fingerprint = client_state(0, world)["fingerprint"]
            conn.execute(
                insert(RunAttemptRow).values(
                    run_id=run,
                    number=a + 1,
                    key=f"bench-history-{a}",
                    world_size=world,
                    workers=4,
                    resumed_step=resumed,
                    resumed_attempt=None if a == 0 else a,
                    start_epoch=0 if resumed is None else client_state(resumed, world)["epoch"],
                    start_sample=0 if resumed is None else client_state(resumed, world)["samples"],
                    rolled_back_from=None,
                    algorithm=1,
                    fingerprint=fingerprint,
                    changes=[],
                    created_by="bench",
                    created_at=now,
                )
            )
            rows = []
            for step in range(first, last + 1):
                state = client_state(step, world)
                rows.append(
                    {
                        "run_id": run,
                        "step": step,
                        "epoch": state["epoch"],
                        "sample_in_epoch": state["samples"],
                        "plan": state,
                        "created_at": now,
                        "attempt": a + 1,
                        "superseded_by": None,
                    }
                )
                if len(rows) == 5000:
                    conn.execute(insert(CheckpointRow), rows)
                    rows = []
            if rows:
                conn.execute(insert(CheckpointRow), rows)
        conn.execute(update(RunRow).where(RunRow.id == run).values(latest_step=steps))
    if backend != "sqlite":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE checkpoints"))
    return _db_bytes(engine, backend) - before


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, float]:
    with bench_server(backend, args, "ledger") as srv:
        engine = create_engine(srv.database_url)
        try:
            return _measure(backend, args, srv, engine)
        finally:
            engine.dispose()
            if args.keep:
                print(f"{backend}: kept {srv.tmp}", file=sys.stderr)
            else:
                shutil.rmtree(srv.tmp, ignore_errors=True)


def _measure(
    backend: str, args: argparse.Namespace, srv: BenchServer, engine: Engine
) -> dict[str, float]:
    """Commits per second at ``--ranks``, storage per step, and the audit's time."""
    seed = argparse.Namespace(shards=SHARDS, ranks=1)
    token, runs = _seed(srv.base, srv.admin_token, srv.tmp / "shards", seed)

    def cpu() -> dict[str, float]:
        seconds = {"server": _cpu_seconds(srv.process.pid)}
        if backend != "sqlite":
            seconds["postgres"] = _cpu_seconds(None, command="postgres")
        return seconds

    result = _commits(srv.base, srv.port, token, runs[0], args, cpu) if args.steps else {}
    grown = _write_history(engine, runs[1], args.audit_steps, backend)
    result["audited steps"] = float(args.audit_steps)
    result["bytes/step"] = grown / args.audit_steps
    result["GB per 1M steps"] = grown / args.audit_steps * 1e6 / 1e9
    start = time.perf_counter()
    response = httpx.get(
        f"{srv.base}/v1/runs/{runs[1]}/audit",
        headers={"Authorization": f"Bearer {token}"},
        timeout=600,
    )
    result["audit s"] = time.perf_counter() - start
    response.raise_for_status()
    report = response.json()
    if not report["ok"] or report["checkpoints"] != args.audit_steps:
        raise RuntimeError(f"the audit did not prove the run: {report['failures'][:5]}")
    result["audited epochs"] = float(len(report["epochs"]))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=4096, help="ranks committing every step")
    parser.add_argument("--steps", type=int, default=10, help="steps each rank commits")
    parser.add_argument("--audit-steps", type=int, default=100_000, help="steps of the audited run")
    parser.add_argument("--processes", type=int, default=4, help="load-generator processes")
    parser.add_argument("--warmup-s", type=float, default=8.0, help="time to start and connect")
    parser.add_argument("--keep", action="store_true", help="keep the SQLite database")
    add_server_arguments(parser)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {b: run_backend(b, args) for b in backends}
    print(
        f"\nledger: {args.ranks} ranks x {args.steps} steps of commits in {args.processes} "
        f"processes; audit of {args.audit_steps} steps; {os.cpu_count()} CPUs"
    )
    metrics = list(dict.fromkeys(m for r in results.values() for m in r))
    print(f"{'metric':<28}" + "".join(f"{b:>14}" for b in backends))
    for metric in metrics:
        cells = "".join(
            f"{results[b][metric]:>14.3f}" if metric in results[b] else f"{'-':>14}"
            for b in backends
        )
        print(f"{metric:<28}" + cells)


if __name__ == "__main__":
    main()
