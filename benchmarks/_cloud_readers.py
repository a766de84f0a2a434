"""One reader of benchmarks/cloud_read.py, run in a process of its own.

``python benchmarks/_cloud_readers.py JSON`` reads one shuffled epoch (or its first
``max_batches`` batches) with one library in its documented remote configuration and
prints one JSON line: seconds to the first batch, samples, seconds (and with ``trace``, a
file of each batch's samples by fingerprint, for the parent's mixing figure). A fresh process per
run keeps every reader cold (no warm imports, page cache aside) and lets the parent
measure its CPU time and memory alone. The S3 endpoint comes from the environment
(``AWS_ENDPOINT_URL`` / ``S3_ENDPOINT_URL``), as each library documents.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 32
WORKERS = 2

SHARDSTREAM_MODES: dict[str, dict[str, Any]] = {
    # The client's defaults: ranged reads of the blocks a batch needs first (where the
    # client has them), the rest of each shard filled into the node cache.
    "cache": {},
    # Every shard fetched whole before use (the behaviour before ranged reads).
    "whole-shard": {"ranged_reads": False},
    # No disk: blocks read by range into a bounded memory budget.
    "cacheless": {"memory_only": True},
    # The same, with a process's first batches waiting for whole blocks instead of reading
    # their samples' 64 KiB pieces first (the behaviour before piece reads).
    "cache-blocks": {"piece_read_batches": 0},
    "cacheless-blocks": {"memory_only": True, "piece_read_batches": 0},
}


def missing_options(mode: str) -> list[str]:
    """ReadOptions (or, in a baseline before it, CacheOptions) fields a shardstream mode
    needs that this client does not have."""
    import shardstream.client as client

    groups = [getattr(client, name, None) for name in ("ReadOptions", "CacheOptions")]
    have = {f.name for group in groups if group is not None for f in dataclasses.fields(group)}
    return [name for name in SHARDSTREAM_MODES[mode] if name not in have]


def _options(cache: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """``StreamingDataset`` keywords for the cache at ``cache`` and the read settings
    ``extra``: ``read=ReadOptions(...)``, or in a baseline checkout from before
    ``ReadOptions``, the settings on ``CacheOptions`` as they were then."""
    import shardstream.client as client

    read_options = getattr(client, "ReadOptions", None)
    if read_options is None:
        return {"cache": client.CacheOptions(dir=cache, **extra)}
    return {"cache": client.CacheOptions(dir=cache), "read": read_options(**extra)}


def _shardstream(spec: dict[str, Any]) -> Any:
    from shardstream.client import PlanOptions, ShardstreamLoader, StreamingDataset

    extra = dict(SHARDSTREAM_MODES[spec["mode"]])
    if extra.get("memory_only") and spec.get("memory_budget"):
        extra["memory_budget_bytes"] = int(spec["memory_budget"])
    options = _options(Path(spec["cache"]), extra)
    ds = StreamingDataset(spec["url"], BATCH, plan=PlanOptions(shuffle=True, seed=0), **options)
    # stats=False only when asked: a --baseline checkout may predate the option.
    off = {} if spec.get("stats", True) else {"stats": False}
    loader = ShardstreamLoader(ds, num_workers=WORKERS, **off)
    if spec.get("resume"):
        state = loader.state_dict()
        state["batch"] = int(len(loader) * spec["resume"])
        loader.load_state_dict(state)
    return loader


def _mosaic(spec: dict[str, Any]) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    ds = StreamingDataset(
        remote=spec["url"], local=spec["cache"], batch_size=BATCH, shuffle=True, shuffle_seed=0
    )
    # MosaicML reads index.json with a boto3 client that the DataLoader's forked workers then
    # inherit, keep-alive connection included: two workers reading responses off one socket
    # write each other's bytes into shard files (a shard shifted by 8 KiB, then IndexError).
    # Any store that keeps connections alive shows it (the emulator does, as S3 does; moto's
    # server closes them). Dropping the parent's client gives each worker its own.
    for stream in ds.streams:
        stream._downloader.clean_up()
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def _litdata(spec: dict[str, Any]) -> Any:
    import litdata
    from litdata.streaming import downloader

    # LitData's obstore client refuses plain http:// endpoints and has no option for it;
    # the emulator on loopback is http (real S3 is https).
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    options: dict[str, Any] = {}
    if spec["library"] == "litdata-decode-all":
        # LitData 0.2.76 (any S3 store, plain moto included) shuffles a chunk's items in
        # blocks of 256 counted from the first item of the worker's share of it, but decodes
        # (and caches) aligned windows of 256 counted from the chunk's start. In a chunk
        # split between two workers the share starts mid-window, every block straddles two
        # windows and consecutive items alternate between them: each item decodes a window
        # anew. Such a shared chunk is also never memory-mapped, so each decode reads the
        # whole chunk file first (64-256 MB per sample): one worker spins at 100 % CPU and
        # the loader waits for it. batch_decode="all", a documented StreamingDataset option
        # that changes decoding only (not the order), decodes a chunk once per visit.
        options["batch_decode"] = "all"
    ds = litdata.StreamingDataset(
        spec["url"],
        shuffle=True,
        seed=0,
        cache_dir=spec["cache"],
        storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]},
        **options,
    )
    return litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def _lance_rows(batch: Any) -> list[dict[str, Any]]:
    """LanceDB transform: a record batch -> one ``{"tokens": uint16 row}`` per row (as
    benchmarks/read.py does)."""
    rows = batch.column("tokens").flatten().to_numpy().reshape(batch.num_rows, -1)
    return [{"tokens": row} for row in rows]


def lance_storage_options() -> dict[str, str]:
    """Lance's object-store options for the emulator: its endpoint (plain http on
    loopback) and the test credentials, so that nothing else is asked (no instance
    metadata service, no region lookup)."""
    return {
        "aws_endpoint": os.environ["AWS_ENDPOINT_URL"],
        "allow_http": "true",
        "aws_region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }


def _lancedb(spec: dict[str, Any]) -> Any:
    import lancedb
    from lancedb.streaming import StreamingDataLoader, StreamingDataset

    # spec["url"]: s3://bucket/folder, the database; the table is "tokens" in it.
    table = lancedb.connect(spec["url"], storage_options=lance_storage_options()).open_table(
        "tokens"
    )
    ds = StreamingDataset(
        table, num_splits=WORKERS, shuffle=True, shuffle_seed=0, transform=_lance_rows
    )
    if spec["library"] == "lancedb-inline":
        # No worker processes: the dataset's own pipeline (a thread pool fetching every
        # split's record batches, another transforming them) in the trainer's process.
        return StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)
    # Forked workers segfault in lancedb 0.40 (its runtime warns that fork is experimental);
    # forkserver is what its warning recommends (as in benchmarks/read.py). The workers
    # reopen the table from its URI and storage options.
    return StreamingDataLoader(
        ds, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="forkserver"
    )


READERS = {
    "shardstream": _shardstream,
    "mosaic": _mosaic,
    "litdata": _litdata,  # all defaults
    "litdata-decode-all": _litdata,  # batch_decode="all" (see _litdata)
    "lancedb": _lancedb,  # 2 forkserver workers, as benchmarks/read.py
    "lancedb-inline": _lancedb,  # num_workers=0 (see _lancedb)
}


def fingerprints(tokens: Any) -> np.ndarray[Any, Any]:
    """One uint64 per sample, its first four tokens: the sample's identity (the rows are
    random uint16s, so four of them tell ~65k-row datasets' samples apart)."""
    rows = np.asarray(tokens.numpy() if hasattr(tokens, "numpy") else tokens)[:, :4]
    rows = rows.astype(np.uint64)
    return (rows[:, 0] << 48) | (rows[:, 1] << 32) | (rows[:, 2] << 16) | rows[:, 3]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Seconds to the first batch and for the whole read, from constructing the dataset."""
    t0 = time.perf_counter()
    loader = READERS[spec["library"]](spec)
    it: Iterator[Any] = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - t0
    samples, batches = int(first["tokens"].shape[0]), 1
    seen = [fingerprints(first["tokens"])]  # for the parent's mixing figure
    if not spec.get("resume"):
        limit = spec.get("max_batches") or 0
        for batch in it:
            samples += int(batch["tokens"].shape[0])
            batches += 1
            seen.append(fingerprints(batch["tokens"]))
            if batches == limit:
                break
            if batches % 100 == 0:  # what a reader killed for taking too long had done
                print(f"PROGRESS {samples} {time.perf_counter() - t0:.3f}", flush=True)
    seconds = time.perf_counter() - t0
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    if spec.get("trace"):  # each batch's samples, by fingerprint
        sizes = np.array([len(f) for f in seen])
        np.savez(spec["trace"], fingerprints=np.concatenate(seen), sizes=sizes)
    return {"ttfb": ttfb, "samples": samples, "seconds": seconds}


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    # Imports are not part of the time to the first batch: a training script imports its
    # loader's classes at the top. shardstream.client resolves its names lazily, so they are
    # looked up here too (as `from shardstream.client import ...` does); the peers import
    # theirs with their packages.
    imported = {
        "shardstream": ("shardstream.client", "StreamingDataset", "ShardstreamLoader"),
        "mosaic": ("streaming", "StreamingDataset"),
        "lancedb": ("lancedb.streaming", "StreamingDataset", "StreamingDataLoader"),
        "lancedb-inline": ("lancedb.streaming", "StreamingDataset", "StreamingDataLoader"),
    }.get(spec["library"], ("litdata", "StreamingDataset", "StreamingDataLoader"))
    for name in ("torch", "numpy", "boto3", imported[0]):
        __import__(name)
    for attr in imported[1:]:
        getattr(sys.modules[imported[0]], attr)
    result = run(spec)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # skip slow interpreter teardown of the libraries' threads
