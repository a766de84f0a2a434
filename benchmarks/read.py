"""Read benchmark: one shuffled epoch of tokens, shardstream beside MosaicML, LitData, LanceDB.

65,536 samples x 2,048 uint16 tokens (256 MiB) in 64 MB shards, 2 workers, batch 32;
warm (local disk, page cache) and cold (moto's S3 server on loopback, empty caches).
Each library reads a dataset built by its own writer (``MDSWriter`` / ``litdata.optimize``)
in its documented configuration (MosaicML: ``StreamingDataset(batch_size=32,
shuffle=True)`` + ``DataLoader``; LitData: ``StreamingDataset(shuffle=True)`` +
``StreamingDataLoader``; LanceDB: a table with a ``fixed_size_list<uint16>`` column read by
``lancedb.streaming.StreamingDataset(num_splits=2, shuffle=True, transform=)`` + its
``StreamingDataLoader``, forkserver workers: its fork support segfaults here; warm only).
Also prints the page-cache read rate of the same shard files
(the physical limit), shardstream through torch's plain ``DataLoader`` (to see what the
shared-memory ring buys), and the first batch after resuming at 90% of the epoch.

    python benchmarks/read.py [--samples 65536] [--dir /tmp/shardstream-bench-read] [--no-cold]
        [--only-ours] [--peers mosaic,litdata,lancedb] [--shard-bytes 67108864] [--repeats 1]

``--only-ours`` skips the peers (for before/after comparisons of our own read path, e.g. of
the cache's verification), ``--peers`` names the peers to run; with ``--repeats N`` the best
warm pass of N is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

TOKENS = 2048
BATCH = 32
WORKERS = 2
OURS = "shardstream ShardstreamLoader"
OURS_DL = "shardstream + torch DataLoader"
LANCEDB = "LanceDB StreamingDataset"
PEERS = {"mosaic": "MosaicML StreamingDataset", "litdata": "LitData StreamingDataset"}
PEERS["lancedb"] = LANCEDB
OURS_NO_STATS = "shardstream ShardstreamLoader stats=off"
"""The loader without its input figures (issue 27): their cost is the difference, run for
run in the same repeats."""
SHARD_BYTES = 64 << 20


def tokens(n: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).integers(0, 50_000, (n, TOKENS), dtype=np.uint16)


def _litdata_sample(i: int) -> dict[str, Any]:
    row = np.random.default_rng(i).integers(0, 50_000, TOKENS, dtype=np.uint16)
    return {"tokens": row}


def build(
    root: Path,
    n: int,
    *,
    only_ours: bool = False,
    shard_bytes: int = SHARD_BYTES,
    peers: frozenset[str] = frozenset(PEERS),
) -> dict[str, Path]:
    """Write the datasets once (kept under ``root`` for later runs): ours and ``peers``'."""
    suffix = "" if shard_bytes == SHARD_BYTES else f"-{shard_bytes}"
    paths = {
        "ours": root / f"ours-{n}{suffix}",
        "mosaic": root / f"mosaic-{n}",
        "litdata": root / f"lit-{n}",
        "lancedb": root / f"lance-{n}",
    }
    data = tokens(n)
    if not (paths["ours"] / "index.json").exists():
        from shardstream.mds import MDSWriter

        shutil.rmtree(paths["ours"], ignore_errors=True)
        with MDSWriter(
            paths["ours"], {"tokens": f"ndarray:uint16:{TOKENS}"}, size_limit=shard_bytes
        ) as w:
            for row in data:
                w.write({"tokens": row})
    if only_ours:
        return paths
    if "mosaic" in peers and not (paths["mosaic"] / "index.json").exists():
        from streaming import MDSWriter as MosaicWriter

        shutil.rmtree(paths["mosaic"], ignore_errors=True)
        cols = {"tokens": f"ndarray:uint16:{TOKENS}"}
        with MosaicWriter(out=str(paths["mosaic"]), columns=cols, size_limit=SHARD_BYTES) as w:
            for row in data:
                w.write({"tokens": row})
    if "litdata" in peers and not (paths["litdata"] / "index.json").exists():
        import litdata

        shutil.rmtree(paths["litdata"], ignore_errors=True)
        litdata.optimize(
            fn=_litdata_sample,
            inputs=list(range(n)),
            output_dir=str(paths["litdata"]),
            chunk_bytes="64MB",
            num_workers=2,
            verbose=False,
        )
    if "lancedb" in peers and not (paths["lancedb"] / "tokens.lance").exists():
        import lancedb
        import pyarrow as pa

        shutil.rmtree(paths["lancedb"], ignore_errors=True)
        column = pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), TOKENS)
        lancedb.connect(str(paths["lancedb"])).create_table("tokens", pa.table({"tokens": column}))
    return paths


class Moto:
    """moto's S3 server in its own process (so it does not share the readers' GIL)."""

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
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.url,
            "S3_ENDPOINT_URL": self.url,  # MosaicML's variable
            "AWS_ALLOW_HTTP": "true",  # LitData's obstore refuses http:// endpoints otherwise
            "NO_PROXY": "127.0.0.1,localhost",
        }
        os.environ.update(env)
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=self.url)
        for _ in range(100):
            try:
                self.s3.create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.1)

    def upload(self, folder: Path, prefix: str) -> str:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                self.s3.upload_file(str(path), "bench", f"{prefix}/{path.name}")
        return f"s3://bench/{prefix}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def measure(
    make: Callable[[], Iterator[Any]], count: Callable[[Any], int]
) -> tuple[float, float, int]:
    """(samples/s over the whole epoch, seconds to the first batch, samples)."""
    t0 = time.perf_counter()
    it = make()
    first = next(it)
    ttfb = time.perf_counter() - t0
    n = count(first)
    for batch in it:
        n += count(batch)
    return n / (time.perf_counter() - t0), ttfb, n


def rows_of(batch: Any) -> int:
    return int(batch["tokens"].shape[0])


def ours_loader(url: str, cache: Path, *, workers: int = WORKERS, stats: bool = True) -> Any:
    from shardstream.client import CacheOptions, PlanOptions, ShardstreamLoader, StreamingDataset

    ds = StreamingDataset(
        url, BATCH, plan=PlanOptions(shuffle=True, seed=0), cache=CacheOptions(dir=cache)
    )
    return ShardstreamLoader(ds, num_workers=workers, stats=stats)


def run_ours(url: str, cache: Path, *, stats: bool = True) -> tuple[float, float, int]:
    holder: list[Any] = []

    def make() -> Iterator[Any]:
        holder.append(ours_loader(url, cache, stats=stats))
        return iter(holder[-1])

    try:
        return measure(make, rows_of)
    finally:
        for loader in holder:
            loader.close()


def run_ours_dataloader(url: str, cache: Path) -> tuple[float, float, int]:
    from torch.utils.data import DataLoader

    from shardstream.client import CacheOptions, PlanOptions, StreamingDataset

    def make() -> Iterator[Any]:
        ds = StreamingDataset(url, BATCH, plan=PlanOptions(seed=0), cache=CacheOptions(dir=cache))
        return iter(DataLoader(ds, batch_size=None, num_workers=WORKERS))

    return measure(make, rows_of)


def run_mosaic(remote: str | None, local: Path) -> tuple[float, float, int]:
    from streaming import StreamingDataset as MosaicDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()

    def make() -> Iterator[Any]:
        ds = MosaicDataset(remote=remote, local=str(local), batch_size=BATCH, shuffle=True)
        return iter(DataLoader(ds, batch_size=BATCH, num_workers=WORKERS))

    return measure(make, rows_of)


def run_litdata(input_dir: str, cache: Path | None) -> tuple[float, float, int]:
    import litdata

    def make() -> Iterator[Any]:
        kw: dict[str, Any] = {"shuffle": True}
        if cache is not None:
            kw["cache_dir"] = str(cache)
        if input_dir.startswith("s3://"):
            kw["storage_options"] = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
            # LitData's obstore client refuses plain http:// endpoints and offers no option
            # for it; moto on loopback is http, so allow it (real S3 is https anyway).
            from litdata.streaming import downloader

            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]
        ds = litdata.StreamingDataset(input_dir, **kw)
        return iter(litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS))

    return measure(make, rows_of)


def _lance_rows(batch: Any) -> list[dict[str, Any]]:
    """LanceDB transform: a record batch -> one ``{"tokens": uint16 row}`` per row (numpy
    views of the batch's buffer, as the other readers yield)."""
    rows = batch.column("tokens").flatten().to_numpy().reshape(-1, TOKENS)
    return [{"tokens": row} for row in rows]


def run_lancedb(folder: Path) -> tuple[float, float, int]:
    import lancedb
    from lancedb.streaming import StreamingDataLoader
    from lancedb.streaming import StreamingDataset as LanceDataset

    table = lancedb.connect(str(folder)).open_table("tokens")

    def make() -> Iterator[Any]:
        ds = LanceDataset(
            table, num_splits=WORKERS, shuffle=True, shuffle_seed=0, transform=_lance_rows
        )
        # Forked workers segfault in lancedb 0.40 (its runtime warns that fork is
        # experimental); forkserver is what its warning recommends.
        loader = StreamingDataLoader(
            ds, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="forkserver"
        )
        return iter(loader)

    return measure(make, rows_of)


def page_cache_rate(folder: Path) -> float:
    """Bytes/s reading the shard files sequentially from the page cache (second read)."""
    files = sorted(folder.glob("*.mds"))
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    best = 0.0
    for _ in range(3):
        t0, total = time.perf_counter(), 0
        for path in files:
            with open(path, "rb", buffering=0) as fh:
                while got := fh.readinto(view):
                    total += got
        best = max(best, total / (time.perf_counter() - t0))
    return best


def resume_first_batch(
    url: str, cache: Path, fraction: float, repeats: int = 5
) -> tuple[float, float]:
    """Median seconds to the first batch: fresh start vs resumed at ``fraction``."""
    fresh, resumed = [], []
    for _ in range(repeats):
        for at, out in ((0.0, fresh), (fraction, resumed)):
            t0 = time.perf_counter()
            loader = ours_loader(url, cache)
            if at:
                state = loader.state_dict()
                state["batch"] = int(len(loader) * at)
                loader.load_state_dict(state)
            next(iter(loader))
            out.append(time.perf_counter() - t0)
            loader.close()
    return statistics.median(fresh), statistics.median(resumed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=65_536)
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "shardstream-bench-read"
    )
    parser.add_argument("--no-cold", action="store_true", help="skip the S3 (moto) runs")
    parser.add_argument(
        "--repeats", type=int, default=1, help="warm runs of each reader (best kept)"
    )
    parser.add_argument("--only-ours", action="store_true", help="skip every peer")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="the peers to run (mosaic,litdata,lancedb)"
    )
    parser.add_argument("--shard-bytes", type=int, default=SHARD_BYTES, help="our shard size")
    args = parser.parse_args()
    peers = frozenset(p for p in args.peers.split(",") if p)
    if peers - set(PEERS):
        parser.error(f"--peers: unknown {sorted(peers - set(PEERS))}; known: {sorted(PEERS)}")
    running = {PEERS[p] for p in peers}
    args.dir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    paths = build(
        args.dir,
        args.samples,
        only_ours=args.only_ours,
        shard_bytes=args.shard_bytes,
        peers=peers,
    )
    print(f"datasets ready in {time.perf_counter() - t:.1f}s under {args.dir}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-run-", dir=args.dir))
    results: dict[tuple[str, str], tuple[float, float, int]] = {}

    def record(name: str, mode: str, run: Callable[[], tuple[float, float, int]]) -> None:
        if name not in (OURS, OURS_DL, OURS_NO_STATS) and (args.only_ours or name not in running):
            return
        try:
            got = run()
        except Exception as exc:  # a peer failing must not hide the other numbers
            print(f"{name} {mode}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            return
        if (name, mode) not in results or got[0] > results[name, mode][0]:
            results[name, mode] = got  # the best of the repeats: the least disturbed run
        sps, ttfb, n = got
        print(f"  {name} {mode}: {sps:,.0f} samples/s, first batch {ttfb:.3f}s, {n}", flush=True)

    ours_url = str(paths["ours"] / "index.json")
    warm_cache = work / "ours-cache"
    fresh = resumed = float("nan")
    try:
        # Untimed passes: fill our node cache, and warm every dataset's page cache.
        run_ours(ours_url, warm_cache)
        record("MosaicML StreamingDataset", "warm", lambda: run_mosaic(None, paths["mosaic"]))
        record("LitData StreamingDataset", "warm", lambda: run_litdata(str(paths["litdata"]), None))
        record(LANCEDB, "warm", lambda: run_lancedb(paths["lancedb"]))
        for _ in range(args.repeats):
            record(OURS, "warm", lambda: run_ours(ours_url, warm_cache))
            record(OURS_NO_STATS, "warm", lambda: run_ours(ours_url, warm_cache, stats=False))
            record(OURS_DL, "warm", lambda: run_ours_dataloader(ours_url, warm_cache))
            record("MosaicML StreamingDataset", "warm", lambda: run_mosaic(None, paths["mosaic"]))
            record(
                "LitData StreamingDataset", "warm", lambda: run_litdata(str(paths["litdata"]), None)
            )
            record(LANCEDB, "warm", lambda: run_lancedb(paths["lancedb"]))
        fresh, resumed = resume_first_batch(ours_url, warm_cache, 0.9)
        if not args.no_cold:
            moto = Moto()
            try:
                ours_s3 = moto.upload(paths["ours"], "ours") + "/index.json"
                some = not args.only_ours
                mosaic_s3 = (
                    moto.upload(paths["mosaic"], "mosaic") if some and "mosaic" in peers else ""
                )
                lit_s3 = (
                    moto.upload(paths["litdata"], "litdata") if some and "litdata" in peers else ""
                )
                record(OURS, "cold S3", lambda: run_ours(ours_s3, work / "c1"))
                record(
                    OURS_NO_STATS, "cold S3", lambda: run_ours(ours_s3, work / "c4", stats=False)
                )
                record(
                    "MosaicML StreamingDataset",
                    "cold S3",
                    lambda: run_mosaic(mosaic_s3, work / "c2"),
                )
                record(
                    "LitData StreamingDataset", "cold S3", lambda: run_litdata(lit_s3, work / "c3")
                )
            finally:
                moto.stop()
        rate = page_cache_rate(paths["ours"])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    sample_bytes = TOKENS * 2
    print(
        f"\n{args.samples} samples x {TOKENS} uint16 tokens, batch {BATCH}, {WORKERS} workers, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"{'reader':40} {'mode':8} {'samples/s':>11} {'first batch':>12} {'shardstream / this':>19}"
    )
    for (name, mode), (sps, ttfb, n) in results.items():
        ours = results.get((OURS, mode))
        ratio = f"{ours[0] / sps:.1f}x" if ours else "-"
        assert n == args.samples, f"{name} {mode} read {n} samples"
        print(f"{name:40} {mode:8} {sps:11,.0f} {ttfb:11.3f}s {ratio:>19}")
    print(
        f"{'page-cache read of the shard files':40} {'limit':8} {rate / sample_bytes:11,.0f} "
        f"{'':>12} {'(' + format(rate / 1e9, '.2f') + ' GB/s)':>19}"
    )
    print(f"\nfirst batch, fresh start:       {fresh:.3f}s")
    print(f"first batch, resumed at 90%:    {resumed:.3f}s  ({resumed / fresh:.2f}x fresh)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
