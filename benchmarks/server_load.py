"""Load test of the metadata server: N simulated training ranks start up, then checkpoint.

Each rank (its own keep-alive connection, like a separate process) does what the client
SDK does at start-up -- get the version, read the whole shard index page by page, presign
the URLs of the shards it will read -- and then commits checkpoints. Ranks of one
simulated node (8 ranks) share a run and commit the same state, so commits are a mix of
new (201) and idempotent (200) answers, as in a real job where every rank calls commit.

Three phases, each printed with requests/s, p50/p99 latency, errors and CPU per request
of the server, the load generator and PostgreSQL:

- **start-up, saturated**: every rank starts at once and restarts back to back
  (``--restarts`` times), starting from a cold server. This measures capacity. Its
  latency is queueing by construction: with N requests always in flight, the mean
  latency is N / throughput (Little's law), 100 ms for 256 ranks at 2,560 requests/s.
- **start-up at --rate/s**: start-ups arrive at a fixed pace so that the offered load is
  ``--rate`` requests/s (default 1,000), each rank restarting in turn; a start-up's first
  request is timed from its scheduled time, so a server that falls behind is charged for
  it (no coordinated omission). This is the latency a job sees at that request rate.
- **checkpoints**: every rank commits ``--commits`` steps back to back.
- **start-up + canary**: every rank starts up back to back (saturating the server) while
  a canary commits ``--canary`` checkpoints on a connection of its own; the canary's
  latency p50/p99 is what a training loop's commit sees under a starting job's reads.
- **health under load**: ``/healthz`` and ``/readyz`` probed during the same phase, as
  Kubernetes probes them: the latency their probe timeouts must allow.
- **route: version / index page / index.json / presign**: one kind of request at a time,
  printed with the server's requests per CPU-second for that route.

The server runs as ``shardstream server`` under uvicorn on loopback (``--sqlite-workers``
on SQLite, ``--pg-workers`` on PostgreSQL) with a database-backed read/write token. The
load generator shares the machine's cores with the server, so it is kept lean: a raw
HTTP/1.1 client (``_rawhttp.py``) on uvloop, decoding only the fields the next request
needs. SQLite and PostgreSQL are printed side by side.

    python benchmarks/server_load.py                  # 256 ranks, both databases
    python benchmarks/server_load.py --ranks 64 --backends postgresql --rate 1500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from _rawhttp import ConnectionClosed, RawClient, Response
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

try:
    import uvloop
except ImportError:  # pragma: no cover - installed with uvicorn[standard]
    uvloop = None  # type: ignore[assignment]

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
    done: int = 0  # ranks that finished the phase
    cpu_ms: dict[str, float] = field(default_factory=dict)  # CPU per request, by process
    error_kinds: dict[str, int] = field(default_factory=dict)
    stop: bool = False  # (start-up + canary) the canary is done: the reads stop
    req_per_cpu_s: float = 0.0  # requests per CPU-second of the server

    def per_cpu_s(self, server_cpu_s: float) -> None:
        """Record the server's requests per CPU-second over this phase."""
        self.req_per_cpu_s = len(self.latencies) / server_cpu_s if server_cpu_s else 0.0

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
            "server req/CPU-s": self.req_per_cpu_s,
        } | {f"{who} CPU ms/req": ms for who, ms in self.cpu_ms.items()}


async def _timed(
    client: RawClient,
    phase: Phase,
    method: str,
    target: str,
    body: bytes | None = None,
    *,
    since: float | None = None,
) -> Response | None:
    """One request; its latency counts from ``since`` (its scheduled time) if given."""
    start = time.perf_counter() if since is None else since
    try:
        response = await client.request(method, target, body)
    except (OSError, ConnectionClosed, asyncio.IncompleteReadError) as exc:
        phase.failed(type(exc).__name__)
        phase.latencies.append(time.perf_counter() - start)
        return None
    phase.latencies.append(time.perf_counter() - start)
    if response.status >= 400:
        phase.failed(f"{response.status} {response.body[:80]!r}")
    return response


def _page_keys(body: bytes, first: int, rank: int, ranks: int) -> tuple[list[str], int, str | None]:
    """The keys this rank reads (positions ``rank``, ``rank + ranks``, ...) from one page,
    the page's item count and its next cursor.

    The simulated rank receives every byte of the page but decodes only what its next
    request needs: a full ``json.loads`` of a 1,000-shard page costs the load generator
    0.8-1.5 ms, more than the server spends serving it, and the two share the machine.
    """
    parts = body.split(b'"key":')
    count = len(parts) - 1
    start = (rank - first) % ranks
    keys = [
        json.loads(parts[i + 1][: parts[i + 1].index(b",")]) for i in range(start, count, ranks)
    ]
    cursor = json.loads(body[body.rindex(b'"next_cursor":') + 14 : -1])
    return keys, count, cursor


async def _start_up(
    client: RawClient, rank: int, args: argparse.Namespace, phase: Phase, since: float | None
) -> None:
    """What a rank does at start-up: the version, the whole index, its shards' URLs."""
    v = "/v1/datasets/bench/versions/1"
    await _timed(client, phase, "GET", v, since=since)
    cursor: str | None = None
    mine: list[str] = []
    seen = 0
    while True:
        query = f"limit={args.page_size}" + (f"&cursor={cursor}" if cursor else "")
        page = await _timed(client, phase, "GET", f"{v}/shards?{query}")
        if page is None or page.status != 200:
            break
        keys, count, cursor = _page_keys(page.body, seen, rank, args.ranks)
        mine += keys
        seen += count
        if not cursor:
            break
    if mine := mine[: args.presign]:  # (empty only when the index could not be read)
        request = json.dumps({"keys": mine}).encode()
        await _timed(client, phase, "POST", f"{v}/presign", request)


async def _rank(
    rank: int,
    args: argparse.Namespace,
    clients: list[RawClient],
    runs: list[int],
    phases: dict[str, Phase],
    gates: list[asyncio.Event],
    t0: list[float],
) -> None:
    client = clients[rank]
    await gates[0].wait()  # saturated start-up: every rank at once, back to back
    for _ in range(args.restarts):
        await _start_up(client, rank, args, phases["start-up, saturated"], None)
    phases["start-up, saturated"].done += 1
    await gates[1].wait()  # paced start-up: start-ups arrive at --rate requests/s
    per_s = args.rate / _requests_per_start_up(args)
    for k in range(args.restarts):
        due = t0[0] + (k * args.ranks + rank) / per_s
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        await _start_up(client, rank, args, phases[_paced(args)], due)
    phases[_paced(args)].done += 1
    await gates[2].wait()  # checkpoints: every rank of a node commits the same state
    run_id = runs[rank // RANKS_PER_NODE]
    for step in range(1, args.commits + 1):
        state = {
            "step": step * 100,
            "epoch": 0,
            "sample_in_epoch": step * 100 * 256,
            "plan": {"p": 8},
        }
        body = json.dumps(state).encode()
        await _timed(client, phases["checkpoints"], "POST", f"/v1/runs/{run_id}/checkpoints", body)
    phases["checkpoints"].done += 1
    await gates[3].wait()  # saturating start-up reads while the canary commits
    reads = phases[READ_LOAD]
    while not reads.stop:
        await _start_up(client, rank, args, reads, None)
    reads.done += 1
    for gate, (route, method, target, payload) in zip(gates[4:], _routes(args), strict=True):
        await gate.wait()  # one route at a time: its CPU per request
        for _ in range(args.route_requests):
            await _timed(client, phases[route], method, target, payload)
        phases[route].done += 1


READ_LOAD = "start-up + canary"
CANARY = "canary commits"
HEALTH = "health under load"


def _routes(args: argparse.Namespace) -> list[tuple[str, str, str, bytes | None]]:
    """The hot routes of a start-up, one phase each: (phase, method, target, body)."""
    v = "/v1/datasets/bench/versions/1"
    keys = [f"shard.{i:06d}.mds.zstd" for i in range(args.presign)]
    return [
        ("route: version", "GET", v, None),
        ("route: index page", "GET", f"{v}/shards?limit={args.page_size}", None),
        ("route: index.json", "GET", f"{v}/index.json", None),
        ("route: presign", "POST", f"{v}/presign", json.dumps({"keys": keys}).encode()),
    ]


async def _canary(
    args: argparse.Namespace,
    port: int,
    headers: dict[str, str],
    run_id: int,
    phases: dict[str, Phase],
) -> None:
    """Commit ``--canary`` checkpoints, one every ``--canary-every-ms``, on a connection of
    their own, while the ranks saturate the server with start-up reads; then stop them."""
    client = RawClient("127.0.0.1", port, headers)
    reads, canary = phases[READ_LOAD], phases[CANARY]
    await asyncio.sleep(args.canary_warmup_s)  # let the reads fill the server first
    for step in range(1, args.canary + 1):
        body = json.dumps(
            {"step": step, "epoch": 0, "sample_in_epoch": step * 256, "plan": {"canary": 1}}
        ).encode()
        await _timed(client, canary, "POST", f"/v1/runs/{run_id}/checkpoints", body)
        await asyncio.sleep(args.canary_every_ms / 1000)
    reads.stop = True
    await client.close()


async def _prober(port: int, phases: dict[str, Phase]) -> None:
    """``/healthz`` and ``/readyz`` as Kubernetes asks them (no token, a connection of
    their own, one every 100 ms) while the ranks saturate the server with start-up reads:
    the latency a probe's timeout must allow."""
    client = RawClient("127.0.0.1", port, {})
    reads, health = phases[READ_LOAD], phases[HEALTH]
    while not reads.stop:
        for path in ("/healthz", "/readyz"):
            await _timed(client, health, "GET", path)
        await asyncio.sleep(0.1)
    await client.close()


def _requests_per_start_up(args: argparse.Namespace) -> int:
    return 2 + -(-args.shards // args.page_size)


def _paced(args: argparse.Namespace) -> str:
    return f"start-up at {args.rate:g}/s"


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


def _mds_entry(key: str, i: int) -> dict[str, object]:
    """An ``index.json`` entry the size our writer makes for a 64 MiB shard (block digests
    every 4 MiB, the header's and the piece table's digests): about 800 bytes."""
    return {
        "column_encodings": ["ndarray:uint16:2048"],
        "column_names": ["tokens"],
        "column_sizes": [4096],
        "compression": "zstd:3",
        "format": "mds",
        "hashes": ["xxh3_64"],
        "raw_data": {
            "basename": key.removesuffix(".zstd"),
            "bytes": 64 << 20,
            "hashes": {
                "blocks:xxh3_64:4194304": f"{i:016x}" * 16,
                "header:xxh3_64:65544": f"{i + 1:016x}",
                "pieces:xxh3_64:65536": f"{i + 2:016x}",
                "xxh3_64": f"{i:016x}",
            },
        },
        "samples": 16384,
        "size_limit": 67108864,
        "version": 2,
        "zip_data": {"basename": key, "bytes": 16, "hashes": {"xxh3_64": f"{i:016x}"}},
    }


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
                    mds=_mds_entry(key, i),
                )
            )
        api.add_shards("bench", draft.number, records)
        api.publish_version("bench", draft.number)
    nodes = (args.ranks + RANKS_PER_NODE - 1) // RANKS_PER_NODE
    # Runs belong to the token that creates them: the one that commits their checkpoints.
    with APIClient(base, token) as bench:
        runs = [
            bench.create_run([("bench", 1)], global_batch_size=256).id for _ in range(nodes + 1)
        ]  # (the last one is the canary's)
    return token, runs


CpuProbe = Callable[[], dict[str, float]]


async def _load(
    args: argparse.Namespace, port: int, token: str, runs: list[int], cpu: CpuProbe
) -> dict[str, Phase]:
    names = ["start-up, saturated", _paced(args), "checkpoints", READ_LOAD]
    names += [route for route, *_ in _routes(args)]
    phases = {name: Phase() for name in [*names, CANARY, HEALTH]}
    gates = [asyncio.Event() for _ in names]
    t0 = [0.0]
    headers = {"Authorization": f"Bearer {token}"}
    clients = [RawClient("127.0.0.1", port, headers) for _ in range(args.ranks)]
    tasks = [
        asyncio.create_task(_rank(r, args, clients, runs, phases, gates, t0))
        for r in range(args.ranks)
    ]
    canary: asyncio.Task[None] | None = None
    prober: asyncio.Task[None] | None = None
    for name, gate in zip(names, gates, strict=True):
        phase = phases[name]
        before = cpu()
        t0[0] = start = time.perf_counter()
        if name == READ_LOAD:
            canary = asyncio.create_task(_canary(args, port, headers, runs[-1], phases))
            prober = asyncio.create_task(_prober(port, phases))
        gate.set()
        while phase.done < args.ranks and not any(t.done() for t in tasks):
            await asyncio.sleep(0.002)
        phase.wall_s = time.perf_counter() - start
        after = cpu()
        n = max(1, len(phase.latencies))
        phase.cpu_ms = {who: (after[who] - before[who]) * 1000 / n for who in before}
        phase.per_cpu_s(after["server"] - before["server"])
    await asyncio.gather(*tasks, *(t for t in (canary, prober) if t is not None))
    phases[CANARY].wall_s = phases[HEALTH].wall_s = phases[READ_LOAD].wall_s
    for client in clients:
        await client.close()
    return phases


def _wait_ready(server: subprocess.Popen[bytes], base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            err = server.stderr.read().decode() if server.stderr else ""
            raise RuntimeError(f"server did not start: {err}")
        time.sleep(0.1)


@dataclass
class BenchServer:
    """A ``shardstream server`` of a benchmark: its folder, database URL and address."""

    tmp: Path
    database_url: str
    port: int
    base: str
    admin_token: str
    process: subprocess.Popen[bytes]


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options :func:`bench_server` reads: databases to run and uvicorn workers."""
    parser.add_argument("--pg-workers", type=int, default=2, help="uvicorn workers on PostgreSQL")
    parser.add_argument("--sqlite-workers", type=int, default=1, help="uvicorn workers on SQLite")
    parser.add_argument("--backends", default="sqlite,postgresql")


@contextmanager
def bench_server(backend: str, args: argparse.Namespace, prefix: str) -> Iterator[BenchServer]:
    """``shardstream server`` under uvicorn on loopback over a fresh ``backend`` database
    (``--sqlite-workers`` / ``--pg-workers`` processes), ready; stopped and its PostgreSQL
    database dropped at the end. Shared by the server benchmarks."""
    tmp = Path(tempfile.mkdtemp(prefix=f"ss-{prefix}-{backend}-"))
    url, pg_name = _database(backend, tmp)
    port = _free_port()
    admin_token = "ss_bench_" + secrets.token_urlsafe(24)
    workers = args.sqlite_workers if backend == "sqlite" else args.pg_workers
    env = {
        **os.environ,
        "SHARDSTREAM_ADMIN_TOKEN": admin_token,
        "SHARDSTREAM_LOG_LEVEL": "WARNING",
        "SHARDSTREAM_DB_POOL_SIZE": "16",
        # One token stands for every simulated rank: the per-token budget would refuse
        # most of the load (429); this measures the server's own capacity.
        "SHARDSTREAM_TOKEN_CONCURRENCY": "0",
        "SHARDSTREAM_TOKEN_BUSY_S": "0",
        "SHARDSTREAM_STORAGE_ROOTS": str(tmp),  # the admin registers tmp/shards in place
    }
    cmd = [sys.executable, "-m", "shardstream", "server", "--database-url", url]
    cmd += ["--port", str(port), "--data-dir", str(tmp), "--workers", str(workers)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(server, base)
        yield BenchServer(tmp, url, port, base, admin_token, server)
    finally:
        server.terminate()
        server.wait(timeout=30)
        _drop(pg_name)


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Start a server on ``backend``, seed it, run the load; phase summaries."""
    with bench_server(backend, args, "bench") as srv:
        token, runs = _seed(srv.base, srv.admin_token, srv.tmp / "shards", args)

        def cpu() -> dict[str, float]:
            seconds = {
                "server": _cpu_seconds(srv.process.pid),
                "load generator": time.process_time(),
            }
            if backend != "sqlite":
                seconds["postgres"] = _cpu_seconds(None, command="postgres")
            return seconds

        if uvloop is not None:
            uvloop.install()
        load_before = os.getloadavg()[0]
        phases = asyncio.run(_load(args, srv.port, token, runs, cpu))
        # The machine's load beside the figures: a shared machine's other work shows here.
        print(
            f"{backend}: load average (1 min) {load_before:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs",
            file=sys.stderr,
        )
        for name, phase in phases.items():
            for kind, count in sorted(phase.error_kinds.items()):
                print(f"{backend} {name} errors: {count} x {kind}", file=sys.stderr)
        return {name: phase.summary() for name, phase in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=256, help="concurrent simulated ranks")
    parser.add_argument("--shards", type=int, default=2000, help="shards in the version")
    parser.add_argument("--page-size", type=int, default=1000, help="shard index page size")
    parser.add_argument("--presign", type=int, default=32, help="URLs each rank presigns")
    parser.add_argument("--restarts", type=int, default=3, help="start-ups per rank and phase")
    parser.add_argument(
        "--rate", type=float, default=1000, help="offered start-up requests/s of the paced phase"
    )
    parser.add_argument("--commits", type=int, default=5, help="checkpoint commits per rank")
    parser.add_argument(
        "--canary", type=int, default=200, help="canary commits under saturating start-up reads"
    )
    parser.add_argument("--canary-every-ms", type=float, default=20, help="pause between them")
    parser.add_argument("--canary-warmup-s", type=float, default=1.0, help="reads before them")
    parser.add_argument(
        "--route-requests", type=int, default=20, help="requests per rank in each route phase"
    )
    add_server_arguments(parser)
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {b: run_backend(b, args) for b in backends}
    print(
        f"\nserver_load: {args.ranks} ranks, {args.shards} shards (pages of {args.page_size}), "
        f"{args.restarts} start-ups per rank and phase, {args.commits} commits per rank, "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'phase':<22} {'metric':<26}" + "".join(f"{b:>12}" for b in backends)
    if len(backends) == 2:
        header += f"{backends[1] + '/' + backends[0]:>20}"
    print(header)
    for phase in results[backends[0]]:
        metrics = dict.fromkeys(m for b in backends for m in results[b][phase])
        for m in metrics:
            vals = [results[b][phase].get(m, float("nan")) for b in backends]
            line = f"{phase:<22} {m:<26}" + "".join(f"{v:>12.1f}" for v in vals)
            if len(vals) == 2:
                line += f"{(vals[1] / vals[0] if vals[0] else float('nan')):>20.2f}"
            print(line)


if __name__ == "__main__":
    main()
