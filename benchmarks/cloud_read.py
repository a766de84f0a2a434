"""Cold reads from a realistic object store: shardstream beside MosaicML, LitData, LanceDB.

Every reader goes through the cloud emulator (``tests/fixtures/cloud_emulator.py``: moto
behind 20 ms to first byte, 90 MB/s per TCP connection and 5,500 GET/s per key prefix,
S3's figures) with empty caches, one shuffled epoch of 2,048 x uint16 token samples, per-rank
batch 32, 2 workers, one process per run. Datasets of ``--shards`` shards of each
``--shard-mb`` size. shardstream runs in each ``--modes`` the client supports (a mode
the client lacks is skipped with a note), MosaicML Streaming and LitData in their
documented S3 configurations (``S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL`` pointed at the
emulator), LanceDB's ``StreamingDataset`` over the same rows as a table in the emulated
bucket (``lancedb.connect("s3://...", storage_options={"aws_endpoint": ..., "allow_http":
"true", ...})``, one fragment per shard; with 2 forkserver workers, and ``lancedb-inline``
without worker processes); then the first batch after resuming at 90%, the same epoch
with 5% of requests answered 503 SlowDown, and ``--nodes`` nodes (processes with their own caches)
reading at once. The first mode also runs with the loader's input figures off
(``stats=False``), right after the same read with them on, to show what they cost.

    python benchmarks/cloud_read.py [--shard-mb 64,256] [--shards 16] [--nodes 4] [--repeat 3]

With ``--repeat N`` every reader runs once a round for N rounds and each row is the median
round (these machines are noisy); the closing lines give each shardstream row's ratio to
MosaicML's samples/s with the same connection reuse, beside its first batch.

shardstream reads the shards as our writer wrote them (block digests, piece tables) and as
MosaicML's ``MDSWriter`` wrote the same rows (``--writers``), each with connection reuse
(keep-alive, as S3) and without it (``--reuse``: every answer closes its connection, and
each new connection pays ``--handshake-ms``, TCP and TLS set-up). Every reader's batches
are traced back to the dataset's shards (each sample by its first tokens): ``shards/batch``
is the mean number of distinct shards among a batch's samples, a mixing figure that a
uniform shuffle puts at ``shards x (1 - (1 - 1/shards)^32)``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _cloud_readers import missing_options

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.fixtures.cloud_emulator import CloudEmulator, EmulatorSettings, offered  # noqa: E402

TOKENS = 2048
SAMPLE_BYTES = 2 * TOKENS
READERS = Path(__file__).with_name("_cloud_readers.py")
BUCKET = "bench"


def _rows(block: int, count: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(block).integers(0, 50_000, (count, TOKENS), dtype=np.uint16)


def _lit_samples(item: tuple[int, int]) -> Any:
    for row in _rows(*item):
        yield {"tokens": row}


def build(
    root: Path, shard_mb: float, shards: int, *, lit_data: bool = True, lance_db: bool = False
) -> tuple[str, int]:
    """Write the MDS dataset (read by shardstream and MosaicML), the same rows with
    MosaicML's own writer (no block digests, no piece tables), LitData's and (``lance_db``)
    as a LanceDB table, once."""
    limit = int(shard_mb * 1e6)
    per_shard = limit // (SAMPLE_BYTES + 8)
    n = per_shard * shards
    name = f"{shard_mb:g}mb-x{shards}"
    blocks = [(b, min(4096, n - s)) for b, s in enumerate(range(0, n, 4096))]
    mds, lit, theirs = root / f"mds-{name}", root / f"lit-{name}", root / f"mdsm-{name}"
    lance = root / f"lance-{name}"
    if lance_db and not (lance / "tokens.lance").exists():
        import lancedb
        import pyarrow as pa

        # One fragment (Lance's data file) per shard: the table written a shard at a time.
        shutil.rmtree(lance, ignore_errors=True)
        rows = np.concatenate([_rows(*block) for block in blocks])
        db, table = lancedb.connect(str(lance)), None
        for first in range(0, n, per_shard):
            part = rows[first : first + per_shard].reshape(-1)
            data = pa.table({"tokens": pa.FixedSizeListArray.from_arrays(pa.array(part), TOKENS)})
            if table is None:
                table = db.create_table("tokens", data)
            else:
                table.add(data)
    if not (theirs / "index.json").exists():
        from streaming import MDSWriter as MosaicWriter

        shutil.rmtree(theirs, ignore_errors=True)
        columns = {"tokens": f"ndarray:uint16:{TOKENS}"}
        with MosaicWriter(out=str(theirs), columns=columns, size_limit=limit) as mosaic:
            for block in blocks:
                for row in _rows(*block):
                    mosaic.write({"tokens": row})
    if not (mds / "index.json").exists():
        from shardstream.mds import MDSWriter

        shutil.rmtree(mds, ignore_errors=True)
        columns = {"tokens": f"ndarray:uint16:{TOKENS}"}
        with MDSWriter(mds, columns, size_limit=limit) as writer:
            for block in blocks:
                for row in _rows(*block):
                    writer.write({"tokens": row})
    if lit_data and not (lit / "index.json").exists():
        import litdata

        shutil.rmtree(lit, ignore_errors=True)
        litdata.optimize(
            fn=_lit_samples,
            inputs=blocks,
            output_dir=str(lit),
            chunk_bytes=limit,
            num_workers=2,
            verbose=False,
        )
    return name, n


class Moto:
    """moto's S3 server in its own process, the emulator's upstream."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        exe = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.url)
        for _ in range(100):
            try:
                self.s3.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                time.sleep(0.1)

    def upload(self, folder: Path) -> int:
        """Every file under ``folder`` (sub-folders too: a LanceDB table is a tree), keyed
        ``folder-name/relative-path``; the bytes uploaded."""
        from boto3.s3.transfer import TransferConfig

        total, config = 0, TransferConfig(max_concurrency=4)
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                key = f"{folder.name}/{path.relative_to(folder).as_posix()}"
                self.s3.upload_file(str(path), BUCKET, key, Config=config)
                total += path.stat().st_size
        return total

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_rss(roots: set[int]) -> int:
    """Resident bytes of ``roots`` and all their descendants (shared pages count per process)."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
                parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = set(roots), True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree and p not in tree}
        tree |= more
        grew = bool(more)
    total = 0
    for pid in tree:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total * os.sysconf("SC_PAGE_SIZE")


@dataclass
class Row:
    label: str
    ttfb: float
    samples: int
    seconds: float
    cpu_s: float
    rss: int
    stats: dict[str, Any]
    emulator_cpu_s: float
    nodes: int = 1
    mixing: float | None = None  # distinct shards per batch (see Mixing)


def run_readers(
    specs: list[dict[str, Any]], env: dict[str, str], emu: CloudEmulator, timeout_s: float
) -> Row:
    """Run readers at once (one per simulated node); their totals and the emulator's.

    A reader still running after ``timeout_s`` is killed with its workers (a library that
    hangs must not hide the other numbers) and reported as failed.
    """
    emu.reset()
    emu_cpu = _cpu_s(emu.pid)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    procs = []
    for rank, spec in enumerate(specs):
        node_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(len(specs))}
        node_env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", NODE_RANK=str(rank))
        readers = READERS
        if spec.get("root"):  # a baseline checkout's client and reader
            node_env["PYTHONPATH"] = spec["root"]
            readers = Path(spec["root"]) / "benchmarks" / READERS.name
        procs.append(
            subprocess.Popen(
                [sys.executable, str(readers), json.dumps(spec)],
                env=node_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its DataLoader workers can be killed with it
            )
        )
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.2):
            peak = max(peak, _tree_rss({p.pid for p in procs}))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results, deadline = [], time.monotonic() + timeout_s
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate()
                done_so_far = [x.split() for x in out.splitlines() if x.startswith("PROGRESS ")]
                rate = ""
                if done_so_far:
                    samples, seconds = int(done_so_far[-1][1]), float(done_so_far[-1][2])
                    rate = f"; {samples:,} samples in {seconds:.0f} s, {samples / seconds:,.0f}/s"
                raise RuntimeError(f"no epoch after {timeout_s:.0f} s (killed{rate})") from None
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                lines = err.strip().splitlines() or [f"exit status {proc.returncode}"]
                print(err[-3000:], file=sys.stderr)
                raise RuntimeError(lines[-1][:300])
            results.append(json.loads(line[len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        done.set()
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Row(
        label="",
        ttfb=max(r["ttfb"] for r in results),
        samples=sum(r["samples"] for r in results),
        seconds=max(r["seconds"] for r in results),
        cpu_s=cpu,
        rss=peak,
        stats=emu.stats(),
        emulator_cpu_s=_cpu_s(emu.pid) - emu_cpu,
        nodes=len(specs),
    )


class Mixing:
    """How well a reader's batches mix the dataset: the mean number of distinct shards
    (of our writer's, ``per_shard`` consecutive rows each) among a batch's samples, each
    sample known by its first four tokens (``_cloud_readers.fingerprints``). Every reader
    reads the same rows, whichever format holds them, so the figure compares readers; a
    uniform shuffle's expectation is :meth:`uniform`."""

    def __init__(self, n: int, shards: int) -> None:
        from _cloud_readers import fingerprints

        self.per_shard, self.shards = n // shards, shards
        blocks = [(b, min(4096, n - s)) for b, s in enumerate(range(0, n, 4096))]
        keys = np.concatenate([fingerprints(_rows(*block)) for block in blocks])
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    def uniform(self, batch: int = 32) -> float:
        return float(self.shards * (1 - (1 - 1 / self.shards) ** batch))

    def of(self, traces: list[Path]) -> float | None:
        """Mean distinct shards per batch over the runs' traces (None: no trace, as from
        a --baseline checkout's reader, or a sample not in the dataset)."""
        per_batch: list[int] = []
        for trace in traces:
            if not trace.exists():
                return None
            with np.load(trace) as saved:
                fps, sizes = saved["fingerprints"], saved["sizes"]
            at = np.searchsorted(self.keys, fps).clip(0, len(self.keys) - 1)
            if not np.array_equal(self.keys[at], fps):
                return None
            shard = self.order[at] // self.per_shard
            for part in np.split(shard, np.cumsum(sizes)[:-1]):
                per_batch.append(len(np.unique(part)))
        return float(np.mean(per_batch)) if per_batch else None


HEADER = (
    "| dataset | reader | first batch s | samples/s | MB/s | offered MB/s | used | "
    "fetched / dataset | requests | 503s | peak RSS MB | CPU s/GB | emulator CPU s | "
    "shards/batch |"
)


def format_row(dataset: str, row: Row, dataset_bytes: int, settings: EmulatorSettings) -> str:
    st = row.stats
    mbps = row.samples * SAMPLE_BYTES / row.seconds / 1e6
    cap = offered(st, settings)["offered_MBps"]
    used = st["body_bytes"] / row.seconds / 1e6 / cap if cap else 0.0
    cpu_per_gb = row.cpu_s / (row.samples * SAMPLE_BYTES / 1e9)
    whole = "resumed" not in row.label  # a resumed run reads one batch: no rates
    cells = [
        dataset,
        row.label,
        f"{row.ttfb:.3f}",
        f"{row.samples / row.seconds:,.0f}" if whole else "-",
        f"{mbps:,.0f}" if whole else "-",
        f"{cap:,.0f}",
        f"{used:.0%}",
        f"{st['body_bytes'] / dataset_bytes:.3f}",
        f"{st['requests']:,}",
        f"{st['status_503']:,}",
        f"{row.rss / 1e6:,.0f}",
        f"{cpu_per_gb:.1f}" if whole else "-",
        f"{row.emulator_cpu_s:.1f}",
        f"{row.mixing:.1f}" if row.mixing is not None and whole else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def format_median(
    dataset: str, runs: list[Row], dataset_bytes: int, settings: EmulatorSettings
) -> str:
    """The row of the median run (by samples/s), with the rounds' range of samples/s and
    of first-batch seconds when there are several."""
    ranked = sorted(runs, key=lambda r: r.samples / r.seconds)
    line = format_row(dataset, ranked[(len(ranked) - 1) // 2], dataset_bytes, settings)
    if len(runs) < 2 or "resumed" in runs[0].label:
        return line
    rates = [r.samples / r.seconds for r in ranked]
    firsts = sorted(r.ttfb for r in runs)
    spread = (
        f" (range {rates[0]:,.0f}-{rates[-1]:,.0f}/s, first batch "
        f"{firsts[0]:.2f}-{firsts[-1]:.2f} s)"
    )
    cells = line.split(" | ")
    cells[1] += spread
    return " | ".join(cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard-mb", default="64,256", help="shard sizes in MB, comma-separated")
    parser.add_argument("--shards", type=int, default=16, help="shards per dataset")
    parser.add_argument("--modes", default="cache,cacheless,whole-shard")
    parser.add_argument(
        "--peers",
        default="mosaic,litdata-decode-all,litdata,lancedb,lancedb-inline",
        help="mosaic, litdata (defaults), litdata-decode-all (batch_decode='all'), lancedb "
        "(2 forkserver workers), lancedb-inline (num_workers=0)",
    )
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes (0: skip)")
    parser.add_argument("--resume-at", type=float, default=0.9)
    parser.add_argument("--slowdown", type=float, default=0.05, help="injected SlowDown share")
    parser.add_argument("--peer-batches", type=int, default=0, help="peers stop after N batches")
    parser.add_argument("--run-timeout", type=float, default=900, help="seconds per reader")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds: every reader runs once a round, and each row is the median round "
        "(these machines are noisy; a reader's place in the round matters too)",
    )
    parser.add_argument(
        "--writers",
        default="ours,mosaic",
        help="who wrote the shards shardstream reads: ours (block digests, piece tables), "
        "mosaic (MosaicML's MDSWriter: neither; the peers always read ours)",
    )
    parser.add_argument(
        "--reuse",
        default="on,off",
        help="connection reuse: on (keep-alive, as S3 does), off (Connection: close on "
        "every answer, so each request pays a new connection's --handshake-ms)",
    )
    parser.add_argument(
        "--handshake-ms", type=float, default=None, help="new connection (default: --latency-ms)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of an earlier client (git archive REV | tar -x -C DIR): its "
        "shardstream modes also run, on our writer's shards, labelled 'before'",
    )
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--conn-mbps", type=float, default=90.0)
    parser.add_argument("--get-rate", type=float, default=5500.0)
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "shardstream-bench-cloud"
    )
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    modes = []
    for mode in filter(None, args.modes.split(",")):
        lacking = missing_options(mode)
        if lacking:
            print(f"note: shardstream mode {mode!r} skipped: this client has no {lacking}")
        else:
            modes.append(mode)
    peers = [p for p in args.peers.split(",") if p]
    handshake_ms = args.latency_ms if args.handshake_ms is None else args.handshake_ms
    settings = EmulatorSettings(
        latency_s=args.latency_ms / 1000,
        conn_bytes_per_s=args.conn_mbps * 1e6,
        get_rate=args.get_rate,
        handshake_s=handshake_ms / 1000,
    )
    writers = [w for w in args.writers.split(",") if w]
    reuses = [r for r in args.reuse.split(",") if r]
    lit_data = any(p.startswith("litdata") for p in peers)
    lance_db = any(p.startswith("lancedb") for p in peers)
    t = time.perf_counter()
    datasets = [
        build(args.dir, float(mb), args.shards, lit_data=lit_data, lance_db=lance_db)
        for mb in args.shard_mb.split(",")
    ]
    mixing = {name: Mixing(n, args.shards) for name, n in datasets}
    print(f"datasets ready in {time.perf_counter() - t:.1f}s under {args.dir}", flush=True)

    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    os.environ.update(creds, AWS_DEFAULT_REGION="us-east-1", NO_PROXY="127.0.0.1,localhost")
    moto = Moto()
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.dir))
    lines: list[tuple[str, str, int]] = []  # each reader's row, in the order first run
    rows: dict[tuple[str, str], list[Row]] = {}  # its runs, one a round
    failed: list[str] = []
    try:
        sizes: dict[str, int] = {}
        for name, _ in datasets:
            sizes[name] = moto.upload(args.dir / f"mds-{name}")
            if "mosaic" in writers:
                sizes["mdsm-" + name] = moto.upload(args.dir / f"mdsm-{name}")
            if lit_data:
                sizes["lit-" + name] = moto.upload(args.dir / f"lit-{name}")
            if lance_db:
                sizes["lance-" + name] = moto.upload(args.dir / f"lance-{name}")
        with CloudEmulator(moto.url, settings, mirror_dir=args.dir) as emu:
            emu.warm(BUCKET)  # the emulator serves from its mirror: moto stays out of timing
            env = {
                **os.environ,
                "AWS_ENDPOINT_URL": emu.endpoint_url,
                "S3_ENDPOINT_URL": emu.endpoint_url,  # MosaicML's variable
                "AWS_ALLOW_HTTP": "true",
                "PYTHONPATH": str(ROOT),
            }
            run = 0

            def one(label: str, name: str, specs: list[dict[str, Any]], size: int) -> None:
                nonlocal run
                for spec in specs:
                    run += 1
                    spec["cache"] = str(work / f"cache-{run}")
                    spec["trace"] = str(work / f"trace-{run}.npz")
                try:
                    row = run_readers(specs, env, emu, args.run_timeout)
                    row.mixing = mixing[name].of([Path(spec["trace"]) for spec in specs])
                except RuntimeError as exc:  # a peer failing must not hide the others
                    failed.append(f"| {name} | {label} | FAILED: {exc} |")
                    print(failed[-1], flush=True)
                    return
                finally:
                    for spec in specs:
                        shutil.rmtree(spec["cache"], ignore_errors=True)
                        Path(spec["trace"]).unlink(missing_ok=True)
                row.label = label
                if (name, label) not in rows:
                    lines.append((name, label, size))
                rows.setdefault((name, label), []).append(row)
                print(format_row(name, row, size, settings), flush=True)

            for round_no in range(1, args.repeat + 1):
                if args.repeat > 1:
                    print(f"round {round_no} of {args.repeat}", flush=True)
                for reuse, (name, _) in ((r, d) for r in reuses for d in datasets):
                    emu.configure(keep_alive=reuse != "off")
                    tag = ", no reuse" if reuse == "off" else ""
                    mds = f"s3://{BUCKET}/mds-{name}"
                    lit = f"s3://{BUCKET}/lit-{name}"
                    # Cacheless holds the mixing window in memory: give it the whole dataset
                    # (the default 2 GiB is refused for a window of 16 x 256 MB shards).
                    budget = max(2 << 30, int(sizes[name] * 1.1))
                    ours: dict[str, Any] = {"library": "shardstream", "url": mds + "/index.json"}
                    ours["memory_budget"] = budget
                    for writer in writers:
                        prefix = "mds" if writer == "ours" else "mdsm"
                        url = f"s3://{BUCKET}/{prefix}-{name}/index.json"
                        size = sizes[name if writer == "ours" else "mdsm-" + name]
                        who = "" if writer == "ours" else " (MosaicML-written)"
                        for mode in modes:
                            spec = {**ours, "url": url, "mode": mode}
                            if args.baseline and writer == "ours":
                                old = {**spec, "root": str(args.baseline.resolve())}
                                one(f"shardstream {mode}, before{tag}", name, [old], size)
                            one(f"shardstream {mode}{who}{tag}", name, [spec], size)
                            if writer == "ours" and mode == modes[0] and reuse != "off":
                                # The input figures' cost (issue 27): the same read without
                                # them, right after, in the same emulator.
                                off = {**spec, "stats": False}
                                one(f"shardstream {mode}, stats off", name, [off], size)
                    for peer in peers:
                        is_lit = peer.startswith("litdata")
                        url = lit if is_lit else mds
                        size = sizes["lit-" + name] if is_lit else sizes[name]
                        if peer.startswith("lancedb"):  # the database folder; its table "tokens"
                            url, size = f"s3://{BUCKET}/lance-{name}", sizes["lance-" + name]
                        spec = {"library": peer, "url": url, "max_batches": args.peer_batches}
                        first = f", first {args.peer_batches} batches" if args.peer_batches else ""
                        one(f"{peer} (S3 remote{first}){tag}", name, [spec], size)
                    if reuse == "off":
                        continue  # resumes, SlowDown and nodes: with connection reuse only
                    for mode in modes:
                        if args.resume_at:
                            spec = {**ours, "mode": mode, "resume": args.resume_at}
                            one(
                                f"shardstream {mode}, resumed at {args.resume_at:.0%}{tag}",
                                name,
                                [spec],
                                sizes[name],
                            )
                    if args.slowdown and modes:
                        emu.configure(slowdown_rate=args.slowdown)
                        label = f"shardstream {modes[0]}, {args.slowdown:.0%} SlowDown{tag}"
                        one(label, name, [{**ours, "mode": modes[0]}], sizes[name])
                        emu.configure(slowdown_rate=0.0)
                    if args.nodes and modes:
                        specs = [{**ours, "mode": modes[0]} for _ in range(args.nodes)]
                        label = f"shardstream {modes[0]}, {args.nodes} nodes{tag}"
                        one(label, name, specs, sizes[name])
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\n{args.shards} shards per dataset, {TOKENS} x uint16 tokens per sample, batch 32, "
        f"2 workers, {os.cpu_count()} CPUs; emulator {args.latency_ms:g} ms first byte, "
        f"{args.conn_mbps:g} MB/s per connection, {args.get_rate:g} GET/s per prefix, "
        f"{handshake_ms:g} ms per new connection; shards/batch: distinct shards among a "
        f"batch's 32 samples, {mixing[datasets[0][0]].uniform():.1f} for a uniform shuffle"
    )
    if args.repeat > 1:
        print(
            f"each row: the median of {args.repeat} rounds (every reader once a round, in "
            "the same order), by samples/s; 'range' gives the rounds' lowest and highest"
        )
    print(HEADER)
    print("|" + " --- |" * HEADER.count(" |"))
    for name, label, size in lines:
        print(format_median(name, rows[(name, label)], size, settings))
    for line in failed:
        print(line)
    print_ratios(lines, rows)
    return 0


def print_ratios(lines: list[tuple[str, str, int]], rows: dict[tuple[str, str], list[Row]]) -> None:
    """Each shardstream row's samples/s over MosaicML's with the same connection reuse
    (medians), beside its first batch: the cold-path target reads off these lines."""

    def median_rate(runs: list[Row]) -> float:
        return statistics.median_low(r.samples / r.seconds for r in runs)

    for name, label, _ in lines:
        if not label.startswith("shardstream") or "resumed" in label or "nodes" in label:
            continue
        tag = ", no reuse" if label.endswith(", no reuse") else ""
        mosaic = rows.get((name, f"mosaic (S3 remote){tag}"))
        if not mosaic:
            continue
        runs = rows[(name, label)]
        print(
            f"{name} {label}: {median_rate(runs) / median_rate(mosaic):.1f}x MosaicML's "
            f"samples/s, first batch {statistics.median_low(r.ttfb for r in runs):.2f} s "
            f"(MosaicML {statistics.median_low(r.ttfb for r in mosaic):.2f} s)"
        )


if __name__ == "__main__":
    sys.exit(main())
