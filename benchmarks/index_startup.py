"""How long a training rank takes to open a large dataset by name from the server.

A 100,000-shard version (default) is registered on a server (PostgreSQL by default,
uvicorn on loopback). Then ``StreamingDataset("bench@1")`` is opened -- it pins the
version, loads the shard index and builds the epoch plan -- and timed:

- **cold node, 1 rank**: an empty cache; the rank downloads the index from the server;
- **cold node, N ranks at once**: ``--ranks`` processes on one node open it together; one
  downloads, the others wait for its file (the slowest rank's time; on a 2-core machine
  the ranks also queue for the CPU to parse it);
- **restart**: the same node again: the index comes from the node's cache;
- **previous client** (side by side): what the client did before the node index cache,
  for every rank and every start: the version, the streamed MDS ``index.json`` and the
  paged index in pages of 1,000 (against this server, so its server-side gains count).

    python benchmarks/index_startup.py                   # 100,000 shards, 8 ranks
    python benchmarks/index_startup.py --shards 20000 --database sqlite
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import server_load

from shardstream.api_client import APIClient
from shardstream.mds import MDSWriter, load_index
from shardstream.wire import MAX_SHARDS_PER_BATCH, ShardRecord


def _template(tmp: Path) -> dict[str, Any]:
    """A real MDS index entry (one tiny shard of token arrays) to copy per shard."""
    with MDSWriter(tmp / "template", {"tokens": "ndarray:uint16:2048"}, compression="zstd") as w:
        w.write({"tokens": np.zeros(2048, np.uint16)})
    entry = json.loads((tmp / "template" / "index.json").read_text())["shards"][0]
    assert isinstance(entry, dict)
    return entry


def _register(base: str, token: str, root: Path, shards: int) -> None:
    entry = _template(root.parent)
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(shards):
        key = f"shard.{i:06d}.mds.zstd"
        (root / key).write_bytes(b"\0" * 16)
        mds = json.loads(json.dumps(entry))
        mds["raw_data"]["basename"] = f"shard.{i:06d}.mds"
        mds["zip_data"] = {**mds["zip_data"], "basename": key, "bytes": 16}
        records.append(
            ShardRecord(
                index=i,
                key=key,
                samples=mds["samples"],
                raw_bytes=mds["raw_data"]["bytes"],
                stored_bytes=16,
                compression="zstd",
                hashes=mds["zip_data"]["hashes"],
                mds=mds,
            )
        )
    with APIClient(base, token) as api:
        api.create_dataset("bench")
        draft = api.create_version(
            "bench", {"tokens": "ndarray:uint16:2048"}, storage_root=root.as_uri()
        )
        for start in range(0, shards, MAX_SHARDS_PER_BATCH):
            api.add_shards("bench", draft.number, records[start : start + MAX_SHARDS_PER_BATCH])
        api.publish_version("bench", draft.number)


def _open(base: str, token: str, cache: str, ready: Any = None) -> float:
    """Open the dataset as a rank does; seconds taken (also put on ``ready``)."""
    os.environ["SHARDSTREAM_TOKEN"] = token
    from shardstream.client import CacheOptions, ServerOptions, StreamingDataset

    start = time.perf_counter()
    ds = StreamingDataset(
        "bench@1", 32, server=ServerOptions(url=base), cache=CacheOptions(dir=Path(cache))
    )
    seconds = time.perf_counter() - start
    assert len(ds.resolved[0].keys) > 0
    if ready is not None:
        ready.put(seconds)
    return seconds


def _previous_client(base: str, token: str) -> float:
    """The start-up of the client before the node index cache (every rank, every start)."""
    start = time.perf_counter()
    with APIClient(base, token) as api:
        version = api.get_version("bench", 1)
        index = load_index(api.index_json("bench", version.number))
        records = sorted(api.iter_shards("bench", version.number), key=lambda r: r.index)
    assert len(records) == len(index.shards)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--ranks", type=int, default=8, help="ranks of one node opening at once")
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn workers (PostgreSQL)")
    args = parser.parse_args()

    workers = argparse.Namespace(sqlite_workers=1, pg_workers=args.workers)
    with server_load.bench_server(args.database, workers, "startup") as srv:
        tmp, base, admin = srv.tmp, srv.base, srv.admin_token
        t0 = time.perf_counter()
        _register(base, admin, tmp / "shards", args.shards)
        print(
            f"registered and published {args.shards:,} shards in {time.perf_counter() - t0:.1f} s"
        )
        results: dict[str, float] = {}
        results["previous client, every rank"] = _previous_client(base, admin)
        results["cold node, 1 rank"] = _open(base, admin, str(tmp / "node-a"))
        ctx = mp.get_context("spawn")
        ready: Any = ctx.Queue()
        ranks = [
            ctx.Process(target=_open, args=(base, admin, str(tmp / "node-b"), ready))
            for _ in range(args.ranks)
        ]
        for p in ranks:
            p.start()
        per_rank = [ready.get(timeout=600) for _ in ranks]
        for p in ranks:
            p.join()
        results[f"cold node, {args.ranks} ranks at once (slowest)"] = max(per_rank)
        results["restart (node cache)"] = _open(base, admin, str(tmp / "node-a"))
    base_s = results["previous client, every rank"]
    print(f"\nindex_startup: {args.shards:,} shards, {args.database}, {os.cpu_count()} CPUs")
    print(f"{'open StreamingDataset by name':<40} {'seconds':>9} {'vs previous':>12}")
    for name, seconds in results.items():
        print(f"{name:<40} {seconds:>9.2f} {base_s / seconds:>11.1f}x")


if __name__ == "__main__":
    main()
