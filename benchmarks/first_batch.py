"""Time to the first batch, cold, through the cloud emulator: whole shards vs block ranges.

Ranged modes read a cold process's first batches by 64 KiB piece (the digests in the shard
headers, ``--piece-kib``); the ``-blocks`` modes turn that off and wait for whole blocks.

One process (``--workers N``: a ShardstreamLoader with N workers), batch 32 of 2,048 x
uint16 tokens, a shuffled epoch, empty caches; the emulator models S3 (20 ms to first
byte, 90 MB/s per connection).
Prints one line per mode: time to open the dataset, to the first batch, to 20 more, and
the bytes and GETs the emulator served (the whole run, not only the first batch).

    python benchmarks/first_batch.py --shard-mb 64 --shards 8 --block-kib 4096
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import boto3
import numpy as np
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.fixtures.cloud_emulator import CloudEmulator  # noqa: E402

TOKENS = 2048
BUCKET = "bench-first-batch"
MODES = {
    "whole-shard": {"ranged_reads": False},
    "ranged-cache": {},
    "cache-blocks": {"piece_read_batches": 0},
    "cacheless": {"memory_only": True},
    "cacheless-blocks": {"memory_only": True, "piece_read_batches": 0},
    "cacheless-1": {"memory_only": True, "piece_read_batches": 1},
    "cache-1": {"piece_read_batches": 1},
}
"""``-blocks``: the first batches wait for whole digest blocks (no piece reads); ``-1``: only
the first batch reads by piece."""


def _dataset(out: Path, shard_mb: int, shards: int, block: int, piece: int | None) -> None:
    from shardstream.mds import MDSWriter

    per = shard_mb * (1 << 20) // (2 * TOKENS + 64)
    rows = np.random.default_rng(0).integers(0, 50_000, (per, TOKENS), dtype=np.uint16)
    columns = {"tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(
        out, columns, size_limit=shard_mb << 20, block_size=block, piece_size=piece
    ) as writer:
        for i in range(per * shards):
            writer.write({"tokens": rows[i % per]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--block-kib", type=int, default=4096)
    parser.add_argument("--piece-kib", type=int, default=64, help="0: shards without pieces")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    parser.add_argument("--workers", type=int, default=0, help="ShardstreamLoader workers")
    args = parser.parse_args()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from shardstream.client import (
        CacheOptions,
        PlanOptions,
        ReadOptions,
        ShardstreamLoader,
        StreamingDataset,
    )
    from shardstream.storage import open_store

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    os.environ["AWS_ENDPOINT_URL"] = upstream = f"http://{host}:{port}"
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    work = Path(tempfile.mkdtemp(prefix="first-batch-"))
    try:
        piece = (args.piece_kib << 10) or None
        _dataset(work / "ds", args.shard_mb, args.shards, args.block_kib << 10, piece)
        store = open_store(f"s3://{BUCKET}/ds")
        for path in sorted((work / "ds").iterdir()):
            store.upload(path, path.name)
        with CloudEmulator(upstream) as emu:
            os.environ["AWS_ENDPOINT_URL"] = emu.endpoint_url
            emu.warm(BUCKET)
            for mode in args.modes.split(","):
                extra = MODES[mode]
                emu.reset()
                cache = Path(tempfile.mkdtemp(dir=work))
                began = time.perf_counter()
                ds = StreamingDataset(
                    f"s3://{BUCKET}/ds/index.json",
                    32,
                    cache=CacheOptions(dir=cache),
                    read=ReadOptions(**extra),  # type: ignore[arg-type]
                    plan=PlanOptions(seed=1),
                )
                opened = time.perf_counter()
                loader = ShardstreamLoader(ds, num_workers=args.workers) if args.workers else ds
                batches = iter(loader)
                next(batches)
                first = time.perf_counter()
                for _ in range(20):
                    next(batches)
                more = time.perf_counter()
                stats = emu.stats()
                print(
                    f"{args.shard_mb} MB x {args.shards}, blocks {args.block_kib} KiB, "
                    f"{args.workers} workers, {mode:17s} open {opened - began:.2f} s, "
                    f"first batch {first - opened:.3f} s, "
                    f"20 more {more - first:.2f} s, {stats['body_bytes'] / 1e6:.0f} MB in "
                    f"{stats['gets']} GETs, peak {stats['peak_in_flight']} in flight",
                    flush=True,
                )
                if args.workers:
                    loader.close()  # type: ignore[union-attr]
                ds.stream.close()
                shutil.rmtree(cache)
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
