"""Mixing quality of the epoch plan beside MosaicML Streaming's ``py1e``, at equal cache budget.

From the plan alone (no data is read): 1,000 shards x 32,768 samples, cache budgets of 4, 16
and 64 shards. For each we print, for shardstream and for ``py1e``:

* ``distinct``: mean distinct shards per batch of 256 (consecutive epoch positions);
* ``spearman``: Spearman rank correlation between a sample's original index and its epoch
  position (0 = no trace of storage order left);
* ``live``: the largest number of shards "open" at once (first sample read, last sample not
  yet read), i.e. the cache a reader needs to never download a shard twice.

The budget maps to shardstream's ``window = budget x samples_per_shard`` and to py1e's
``shuffle_block_size = budget x samples_per_shard`` (both with one canonical partition /
node, so the comparison isolates the mixing algorithm). py1e's blocks are jittered and
overlap, so at the same nominal budget it keeps more shards open than we do; the last
column gives our distinct count when we may keep as many shards open as py1e did (equal
real cache). Run: ``python benchmarks/mixing.py``
(``--shards 200`` for a quick look).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.typing import NDArray

from shardstream.client.plan import EpochPlan, PlanConfig, SourceSpec

I64 = NDArray[np.int64]
BATCH = 256


def shardstream_order(sizes: I64, budget: int, seed: int) -> I64:
    """Sample id at every epoch position, from the plan (one partition, batch 256)."""
    per_shard = int(sizes[0])
    cfg = PlanConfig(seed=seed, global_batch_size=BATCH, window=budget * per_shard)
    plan = EpochPlan([SourceSpec(shard_sizes=sizes)], cfg, epoch=0)
    step = 4096
    chunks = [
        plan.global_batches(b, min(b + step, plan.num_batches))
        for b in range(0, plan.num_batches, step)
    ]
    return np.concatenate(chunks)


def py1e_order(sizes: I64, budget: int, seed: int) -> I64:
    """The same from MosaicML Streaming's py1e shuffle (one canonical node)."""
    from streaming.base.shuffle import get_shuffle

    block = budget * int(sizes[0])
    return np.asarray(get_shuffle("py1e", sizes, 1, seed, 0, block), dtype=np.int64)


def metrics(order: I64, per_shard: int, num_shards: int) -> tuple[float, float, int]:
    """(mean distinct shards per batch, Spearman rho, max shards open at once)."""
    shards = order // per_shard
    usable = shards.size - shards.size % BATCH
    rows = np.sort(shards[:usable].reshape(-1, BATCH), axis=1)
    distinct = float(((np.diff(rows, axis=1) != 0).sum(axis=1) + 1).mean())
    n = order.size
    d = order.astype(np.float64) - np.arange(n, dtype=np.float64)
    rho = 1.0 - 6.0 * float(np.dot(d, d)) / (n * (float(n) ** 2 - 1.0))
    pos = np.arange(n)
    first = np.full(num_shards, n, dtype=np.int64)
    last = np.full(num_shards, -1, dtype=np.int64)
    np.minimum.at(first, shards, pos)
    np.maximum.at(last, shards, pos)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, first, 1)
    np.add.at(delta, last + 1, -1)
    live = int(np.cumsum(delta).max())
    return distinct, rho, live


def measure(name: str, fn: Callable[[], I64], per_shard: int, shards: int) -> dict[str, float]:
    t0 = time.perf_counter()
    order = fn()
    elapsed = time.perf_counter() - t0
    assert np.array_equal(np.sort(order), np.arange(order.size)), f"{name}: not a permutation"
    distinct, rho, live = metrics(order, per_shard, shards)
    return {"distinct": distinct, "rho": rho, "live": live, "time": elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--samples-per-shard", type=int, default=32768)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    sizes = np.full(args.shards, args.samples_per_shard, dtype=np.int64)
    print(
        f"mixing from the plan alone: {args.shards} shards x {args.samples_per_shard} samples, "
        f"batches of {BATCH}, one partition / canonical node, seed {args.seed}"
    )
    header = (
        f"{'budget':>6} | {'distinct/batch':>22} {'ratio':>6} | {'spearman rho':>21} | "
        f"{'max shards open':>17} | {'equal open':>16} | {'time s':>13}"
    )
    print(header)
    print(
        f"{'shards':>6} | {'ours':>10} {'py1e':>11} {'':>6} | {'ours':>10} {'py1e':>10} | "
        f"{'ours':>8} {'py1e':>8} | {'ours/open':>9} {'ratio':>6} | {'ours':>6} {'py1e':>6}"
    )
    print("-" * len(header))
    for budget in args.budgets:
        ours = measure(
            "shardstream",
            partial(shardstream_order, sizes, budget, args.seed),
            args.samples_per_shard,
            args.shards,
        )
        peer = measure(
            "py1e",
            partial(py1e_order, sizes, budget, args.seed),
            args.samples_per_shard,
            args.shards,
        )
        # Equal real cache: the largest whole-shard window that keeps no more shards open
        # than py1e did.
        equal_budget = int(peer["live"])
        while True:
            equal = measure(
                "shardstream",
                partial(shardstream_order, sizes, equal_budget, args.seed),
                args.samples_per_shard,
                args.shards,
            )
            if equal["live"] <= peer["live"] or equal_budget <= budget:
                break
            equal_budget -= 1
        print(
            f"{budget:>6} | {ours['distinct']:>10.2f} {peer['distinct']:>11.2f} "
            f"{ours['distinct'] / peer['distinct']:>6.2f} | {ours['rho']:>10.5f} "
            f"{peer['rho']:>10.5f} | {ours['live']:>8d} {peer['live']:>8d} | "
            f"{equal['distinct']:>5.2f}/{int(equal['live']):<3d} "
            f"{equal['distinct'] / peer['distinct']:>6.2f} | "
            f"{ours['time']:>6.1f} {peer['time']:>6.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
