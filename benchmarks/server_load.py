"""Load test of the metadata server: N simulated training ranks start up, then checkpoint.

Each rank (an asyncio task with its own connection, like a separate process) does what the
client SDK does at start-up -- get the version, read the whole shard index page by page,
presign the URLs of the shards it will read -- and then commits checkpoints. Ranks of one
simulated node (8 ranks) share a run and commit the same state, so commits are a mix of
new (201) and idempotent (200) answers, as in a real job where every rank calls commit.

The server runs as ``shardstream server`` under uvicorn on loopback (1 worker on SQLite,
``--pg-workers`` on PostgreSQL) with a database-backed read/write token. Prints requests/s,
p50/p99 latency and errors per phase, SQLite and PostgreSQL side by side.

    python benchmarks/server_load.py                  # 256 ranks, both databases
    python benchmarks/server_load.py --ranks 64 --backends postgresql
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_SERVER = os.environ.get(
    "SHARDSTREAM_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RANKS_PER_NODE = 8


@dataclass
class Phase:
    """Latencies and errors of one phase."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    wall_s: float = 0.0
    error_kinds: dict[str, int] = field(default_factory=dict)

    def failed(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def summary(self) -> dict[str, float]:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.zeros(1)
        return {
            "requests": float(len(self.latencies)),
            "req/s": len(self.latencies) / self.wall_s if self.wall_s else 0.0,
            "p50 ms": float(np.percentile(lat, 50)),
            "p99 ms": float(np.percentile(lat, 99)),
            "errors": float(self.errors),
        }


async def _timed(
    client: httpx.AsyncClient, phase: Phase, method: str, url: str, **kw: object
) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        response = await client.request(method, url, **kw)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        phase.failed(type(exc).__name__)
        phase.latencies.append(time.perf_counter() - start)
        return None
    phase.latencies.append(time.perf_counter() - start)
    if response.status_code >= 400:
        phase.failed(f"{response.status_code} {response.text[:80]}")
    return response


async def _rank(
    rank: int,
    args: argparse.Namespace,
    base: str,
    token: str,
    runs: list[int],
    startup: Phase,
    commits: Phase,
    gates: tuple[asyncio.Event, asyncio.Event],
    started: list[int],
) -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=60
    ) as client:
        await gates[0].wait()
        v = "/v1/datasets/bench/versions/1"
        for _ in range(args.restarts):
            await _timed(client, startup, "GET", v)
            cursor: str | None = None
            keys: list[str] = []
            while True:
                params = {"limit": args.page_size} | ({"cursor": cursor} if cursor else {})
                page = await _timed(client, startup, "GET", f"{v}/shards", params=params)
                if page is None or page.status_code != 200:
                    break
                body = page.json()
                keys += [s["key"] for s in body["items"]]
                cursor = body["next_cursor"]
                if not cursor:
                    break
            mine = keys[rank % args.ranks :: args.ranks][: args.presign] or keys[: args.presign]
            if mine:  # (empty only when the index could not be read: already an error)
                await _timed(client, startup, "POST", f"{v}/presign", json={"keys": mine})
        run_id = runs[rank // RANKS_PER_NODE]
        started.append(rank)
        await gates[1].wait()  # every rank has finished start-up
        for step in range(1, args.commits + 1):
            state = {
                "step": step * 100,
                "epoch": 0,
                "sample_in_epoch": step * 100 * 256,
                "plan": {"p": 8},
            }
            await _timed(client, commits, "POST", f"/v1/runs/{run_id}/checkpoints", json=state)


def _cpu_seconds(root_pid: int | None, *, command: str | None = None) -> float:
    """CPU time (user+system) of ``root_pid`` and its descendants, or of every process whose
    command is ``command`` (e.g. the PostgreSQL backends), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick, name)
    if command is not None:
        return sum(cpu for _, cpu, name in stats.values() if name == command)
    total, frontier = 0.0, {root_pid}
    while frontier:
        total += sum(stats[p][1] for p in frontier if p in stats)
        frontier = {p for p, (ppid, _, _) in stats.items() if ppid in frontier}
    return total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _database(backend: str, tmp: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'bench.db'}", None
    name = f"shardstream_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(PG_SERVER).set(database=name).render_as_string(hide_password=False), name


def _drop(name: str | None) -> None:
    if name:
        admin = create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _seed(
    base: str, admin_token: str, root: Path, args: argparse.Namespace
) -> tuple[str, list[int]]:
    from shardstream.api_client import APIClient
    from shardstream.wire import ShardRecord

    root.mkdir(parents=True, exist_ok=True)
    with APIClient(base, admin_token) as api:
        token = api.create_token("bench", ["write"]).secret
        assert token is not None
        api.create_dataset("bench")
        draft = api.create_version(
            "bench", {"tokens": "ndarray:uint16:2048"}, storage_root=root.as_uri()
        )
        records = []
        for i in range(args.shards):
            key = f"shard.{i:06d}.mds.zstd"
            (root / key).write_bytes(b"\0" * 16)
            records.append(
                ShardRecord(
                    index=i,
                    key=key,
                    samples=4096,
                    raw_bytes=16 << 20,
                    stored_bytes=16,
                    compression="zstd",
                    hashes={"xxh3_64": f"{i:016x}"},
                )
            )
        api.add_shards("bench", draft.number, records)
        api.publish_version("bench", draft.number)
        nodes = (args.ranks + RANKS_PER_NODE - 1) // RANKS_PER_NODE
        runs = [api.create_run([("bench", 1)], global_batch_size=256).id for _ in range(nodes)]
    return token, runs


async def _load(
    args: argparse.Namespace, base: str, token: str, runs: list[int]
) -> tuple[Phase, Phase]:
    startup, commits = Phase(), Phase()
    gates = (asyncio.Event(), asyncio.Event())
    started: list[int] = []
    tasks = [
        asyncio.create_task(_rank(r, args, base, token, runs, startup, commits, gates, started))
        for r in range(args.ranks)
    ]
    await asyncio.sleep(0.2)  # let every task open its client first
    t0 = time.perf_counter()
    gates[0].set()
    while len(started) < args.ranks and not any(t.done() for t in tasks):
        await asyncio.sleep(0.002)
    t1 = time.perf_counter()
    startup.wall_s = t1 - t0
    gates[1].set()
    await asyncio.gather(*tasks)
    commits.wall_s = time.perf_counter() - t1
    return startup, commits


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Start a server on ``backend``, seed it, run the load; phase summaries."""
    tmp = Path(tempfile.mkdtemp(prefix=f"ss-bench-{backend}-"))
    url, pg_name = _database(backend, tmp)
    port = _free_port()
    admin_token = "ss_bench_" + secrets.token_urlsafe(24)
    workers = 1 if backend == "sqlite" else args.pg_workers
    env = {
        **os.environ,
        "SHARDSTREAM_ADMIN_TOKEN": admin_token,
        "SHARDSTREAM_LOG_LEVEL": "WARNING",
        "SHARDSTREAM_DB_POOL_SIZE": "16",
    }
    cmd = [
        sys.executable,
        "-m",
        "shardstream",
        "server",
        "--database-url",
        url,
        "--port",
        str(port),
        "--data-dir",
        str(tmp),
        "--workers",
        str(workers),
    ]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                err = server.stderr.read().decode() if server.stderr else ""
                raise RuntimeError(f"server did not start: {err}")
            time.sleep(0.1)
        token, runs = _seed(base, admin_token, tmp / "shards", args)
        cpu0 = (
            _cpu_seconds(server.pid),
            _cpu_seconds(None, command="postgres"),
            time.process_time(),
        )
        startup, commits = asyncio.run(_load(args, base, token, runs))
        cpu1 = (
            _cpu_seconds(server.pid),
            _cpu_seconds(None, command="postgres"),
            time.process_time(),
        )
        n = len(startup.latencies) + len(commits.latencies)
        cpu = {
            "server ms/req": (cpu1[0] - cpu0[0]) * 1000 / n,
            "postgres ms/req": (cpu1[1] - cpu0[1]) * 1000 / n if backend != "sqlite" else 0.0,
            "client ms/req": (cpu1[2] - cpu0[2]) * 1000 / n,
        }
        for name, phase in (("start-up", startup), ("checkpoints", commits)):
            for kind, count in sorted(phase.error_kinds.items()):
                print(f"{backend} {name} errors: {count} x {kind}", file=sys.stderr)
        return {"start-up": startup.summary(), "checkpoints": commits.summary(), "cpu": cpu}
    finally:
        server.terminate()
        server.wait(timeout=30)
        _drop(pg_name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=256, help="concurrent simulated ranks")
    parser.add_argument("--shards", type=int, default=2000, help="shards in the version")
    parser.add_argument("--page-size", type=int, default=1000, help="shard index page size")
    parser.add_argument("--presign", type=int, default=32, help="URLs each rank presigns")
    parser.add_argument("--restarts", type=int, default=3, help="start-ups per rank")
    parser.add_argument("--commits", type=int, default=5, help="checkpoint commits per rank")
    parser.add_argument("--pg-workers", type=int, default=2, help="uvicorn workers on PostgreSQL")
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {b: run_backend(b, args) for b in backends}
    print(
        f"\nserver_load: {args.ranks} ranks, {args.shards} shards (pages of {args.page_size}), "
        f"{args.restarts} start-ups + {args.commits} commits per rank, {os.cpu_count()} CPUs"
    )
    metrics = ["requests", "req/s", "p50 ms", "p99 ms", "errors"]
    header = f"{'phase':<12} {'metric':<16}" + "".join(f"{b:>14}" for b in backends)
    if len(backends) == 2:
        header += f"{backends[1] + '/' + backends[0]:>22}"
    print(header)
    for phase in ("start-up", "checkpoints", "cpu"):
        for m in metrics if phase != "cpu" else list(results[backends[0]]["cpu"]):
            vals = [results[b][phase][m] for b in backends]
            line = f"{phase:<12} {m:<16}" + "".join(f"{v:>14.1f}" for v in vals)
            if len(vals) == 2:
                line += f"{(vals[1] / vals[0] if vals[0] else float('nan')):>22.2f}"
            print(line)


if __name__ == "__main__":
    main()
