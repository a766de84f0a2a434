"""Time and memory to plan one rank's epoch at scale, beside MosaicML Streaming.

"Planning one rank's epoch" is everything a rank does before it can read data: build the
epoch plan from the shard sizes, seed and epoch; walk the rank's shard list in need order
(what the prefetcher iterates); and compute the sample ids of its DataLoader worker's first
8 batches. Each measurement runs in a fresh process, so peak RSS is that work's alone.

* shardstream at the target scale: 1e9 samples in 100k shards (random sizes), 512 nodes x 8
  ranks x 8 workers, 8 samples per rank per batch, ``num_partitions`` = 4096 (one per rank).
  Target: < 1 s and < 100 MB. Also: all of that worker's batches for the whole epoch.
  ``shardstream:default`` uses the loader's default shape for that job (4 partitions a
  rank), ``shardstream:resumed`` the same plan read by 2,048 ranks after an elastic resume.
* MosaicML Streaming's equivalent (``py1e`` shuffle + ``get_partitions_orig`` for the same
  topology) materializes int64/float64 arrays per sample, so it runs at 1e7 samples (a
  1e9 run needs tens of GB); shardstream is measured at 1e7 too for the side-by-side ratio.

Run: ``python benchmarks/plan_scale.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np
from numpy.typing import NDArray

NODES, RANKS, WORKERS, PER_RANK = 512, 8, 8, 8


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _sizes(samples: int, shards: int) -> NDArray[np.int64]:
    rng = np.random.default_rng(0)
    mean = samples // shards
    sizes = rng.integers(mean // 2, mean * 3 // 2, size=shards).astype(np.int64)
    sizes = sizes * samples // int(sizes.sum())
    sizes[: samples - int(sizes.sum())] += 1
    assert int(sizes.sum()) == samples
    return sizes


def child_ours(samples: int, shards: int, shape: str = "one") -> dict[str, Any]:
    """``shape``: ``one`` partition a rank; ``default``: the loader's default for this world
    size (4 a rank); ``resumed``: that default read by half the ranks (after a resume)."""
    from shardstream.plan import EpochPlan, PlanConfig, SourceSpec, default_shape

    sizes = _sizes(samples, shards)
    world = NODES * RANKS
    batch = world * PER_RANK
    rss0 = _rss_kib("VmRSS")
    tracemalloc.start()
    t0 = time.perf_counter()
    specs = [SourceSpec(shard_sizes=sizes)]
    parts, window = (world, None) if shape == "one" else default_shape(batch, world, specs)
    if shape == "resumed":
        world //= 2
    rank, worker = world - 1, WORKERS - 1
    cfg = PlanConfig(seed=7, global_batch_size=batch, num_partitions=parts, window=window)
    plan = EpochPlan(specs, cfg, epoch=3)
    t1 = time.perf_counter()
    order = plan.rank_shards(rank, world, start_batch=0)
    walked = sum(1 for _ in order.tolist())
    t2 = time.perf_counter()
    mine = list(plan.worker_batches(0, worker, WORKERS))
    first = plan.rank_batches(np.array(mine[:8]), rank, world)
    t3 = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_peak = _rss_kib("VmHWM")
    t4 = time.perf_counter()
    whole = plan.rank_batches(np.array(mine), rank, world)
    t5 = time.perf_counter()
    assert first.shape == (8, batch // world) and walked == order.size
    return {
        "construct_s": t1 - t0,
        "shard_order_s": t2 - t1,
        "first_batches_s": t3 - t2,
        "total_s": t3 - t0,
        "traced_peak_mib": peak / 2**20,
        "rss_peak_mib": rss_peak / 1024,
        "rss_delta_mib": (rss_peak - rss0) / 1024,
        "rank_shards": int(order.size),
        "worker_epoch_batches": len(mine),
        "worker_epoch_s": t5 - t4,
        "worker_epoch_samples": int(whole.size),
    }


def child_mosaic(samples: int, shards: int) -> dict[str, Any]:
    from streaming.base.partition import get_partitions
    from streaming.base.shuffle import get_shuffle

    sizes = _sizes(samples, shards)
    rss0 = _rss_kib("VmRSS")
    tracemalloc.start()
    t0 = time.perf_counter()
    ids = get_shuffle("py1e", sizes, NODES, 7, 3, 1 << 18)
    t1 = time.perf_counter()
    parts = get_partitions("orig", int(sizes.sum()), NODES, NODES, RANKS, WORKERS, PER_RANK)
    mine = ids[parts[NODES - 1, RANKS - 1, WORKERS - 1, :8].ravel()]
    mine_shards = np.unique(np.searchsorted(np.cumsum(sizes), ids[parts[-1, -1]].ravel()))
    t2 = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_peak = _rss_kib("VmHWM")
    assert mine.size == 8 * PER_RANK
    return {
        "construct_s": t1 - t0,
        "shard_order_s": 0.0,
        "first_batches_s": t2 - t1,
        "total_s": t2 - t0,
        "traced_peak_mib": peak / 2**20,
        "rss_peak_mib": rss_peak / 1024,
        "rss_delta_mib": (rss_peak - rss0) / 1024,
        "rank_shards": int(mine_shards.size),
    }


def run_child(kind: str, samples: int, shards: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, str(samples), str(shards)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SAMPLES", "SHARDS"))
    args = parser.parse_args()
    if args.child:
        kind, samples, shards = args.child[0], int(args.child[1]), int(args.child[2])
        if kind.startswith("ours"):
            print(json.dumps(child_ours(samples, shards, kind.partition(":")[2] or "one")))
        else:
            print(json.dumps(child_mosaic(samples, shards)))
        return
    topo = f"{NODES} nodes x {RANKS} ranks x {WORKERS} workers, {PER_RANK} samples/rank/batch"
    print(f"planning one rank's epoch ({topo}); each row a fresh process")
    cols = ["construct_s", "shard_order_s", "first_batches_s", "total_s", "traced_peak_mib"]
    cols += ["rss_delta_mib", "rss_peak_mib"]
    print(f"{'planner':<22} {'samples':>13} {'shards':>7} " + " ".join(f"{c:>15}" for c in cols))
    rows = [
        ("shardstream", 10**9, 100_000),
        ("shardstream:default", 10**9, 100_000),
        ("shardstream:resumed", 10**9, 100_000),
        ("shardstream", 10**7, 1_000),
        ("mosaicml py1e+orig", 10**7, 1_000),
    ]
    results = {}
    for name, samples, shards in rows:
        kind = "ours" + name[len("shardstream") :] if name.startswith("shardstream") else "mosaic"
        res = run_child(kind, samples, shards)
        results[(name, samples)] = res
        vals = " ".join(f"{res[c]:>15.3f}" for c in cols)
        print(f"{name:<22} {samples:>13,} {shards:>7,} {vals}", flush=True)
    ours, peer = results[("shardstream", 10**7)], results[("mosaicml py1e+orig", 10**7)]
    print(
        f"at 1e7 samples: shardstream is {peer['total_s'] / ours['total_s']:.0f}x faster and uses "
        f"{peer['traced_peak_mib'] / max(ours['traced_peak_mib'], 1e-3):.0f}x less traced memory"
    )
    big = results[("shardstream", 10**9)]
    print(
        f"1e9 samples: one rank lists {big['rank_shards']} shards; its worker's whole epoch "
        f"({big['worker_epoch_batches']} batches, {big['worker_epoch_samples']:,} samples) "
        f"computes in {big['worker_epoch_s']:.3f} s; target < 1 s and < 100 MB: "
        f"{'met' if big['total_s'] < 1 and big['rss_delta_mib'] < 100 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
