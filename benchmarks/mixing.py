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

``--defaults`` instead compares the loader's default plan shape (partitions, window) before
and after elastic resume on any world size, per rank of a ``W``-rank job with 30 samples a
rank: mean distinct shards per rank batch, the most shards a rank holds open, and the bytes
a node reads per epoch over its share (1 rank per node) on the first world size and on
every other world size dividing the batch that the run might be resumed on.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from numpy.typing import NDArray

from shardstream.plan import EpochPlan, PlanConfig, SourceSpec, default_shape

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


def legacy_shape(batch: int, world: int) -> tuple[int, int | None]:
    """The default before elastic resume on any world size: ``P`` = the largest divisor of
    ``B`` up to ``max(8, W)`` that ``W`` divides or is divided by; the plan's own window."""
    cap = max(8, world)
    parts = max(
        p
        for p in range(1, min(cap, batch) + 1)
        if batch % p == 0 and (p % world == 0 or world % p == 0)
    )
    return parts, None


def rank_metrics(plan: EpochPlan, rank: int, world: int) -> tuple[float, int]:
    """(mean distinct shards per rank batch, most shards open at once) for one rank."""
    ids = plan.rank_batches(np.arange(plan.num_batches), rank, world)
    shards = plan.locate(ids.ravel())[0].reshape(ids.shape)
    rows = np.sort(shards, axis=1)
    distinct = float(((np.diff(rows, axis=1) != 0).sum(axis=1) + 1).mean())
    seq = shards.ravel()
    n = seq.size
    first = np.full(plan.num_shards, n, dtype=np.int64)
    last = np.full(plan.num_shards, -1, dtype=np.int64)
    pos = np.arange(n)
    np.minimum.at(first, seq, pos)
    np.maximum.at(last, seq, pos)
    delta = np.zeros(n + 1, dtype=np.int64)
    used = last >= 0
    np.add.at(delta, first[used], 1)
    np.add.at(delta, last[used] + 1, -1)
    return distinct, int(np.cumsum(delta).max())


def node_ratio(plan: EpochPlan, nodes: int) -> float:
    """Worst node's bytes (samples of distinct shards read) over its share, 1 rank a node."""
    worst = 0.0
    sizes, every = plan.shard_sizes, np.arange(plan.num_batches)
    for node in range(nodes):
        read = np.unique(plan.locate(plan.rank_batches(every, node, nodes).ravel())[0])
        worst = max(worst, float(sizes[read].sum()) / (plan.total_samples / nodes))
    return worst


def resumed_epoch(plan: EpochPlan, old: int, new: int, cut: int) -> tuple[float, float]:
    """A run of ``old`` nodes (1 rank each) killed after ``cut`` batches and resumed on
    ``new``: (worst new node's bytes in the rest of the epoch over its share of the rest,
    worst bytes over the whole epoch of a node present in both runs over its new share)."""
    sizes, total = plan.shard_sizes, plan.total_samples
    head, tail = np.arange(cut), np.arange(cut, plan.num_batches)
    rest_share = total * (plan.num_batches - cut) / plan.num_batches / new
    worst_rest = worst_epoch = 0.0
    for node in range(new):
        after = set(plan.locate(plan.rank_batches(tail, node, new).ravel())[0].tolist())
        worst_rest = max(worst_rest, float(sizes[list(after)].sum()) / rest_share)
        if node < old:
            ids = plan.rank_batches(head, node, old).ravel()
            both = after | set(plan.locate(ids)[0].tolist())
            worst_epoch = max(worst_epoch, float(sizes[list(both)].sum()) / (total / new))
    return worst_rest, worst_epoch


def compare_defaults(shards: int, per_shard: int, seed: int) -> None:
    sizes = np.full(shards, per_shard, dtype=np.int64)
    specs = [SourceSpec(shard_sizes=sizes)]
    print(f"default plan shape, {shards} shards x {per_shard} samples, 30 samples a rank")
    print(
        f"{'W':>3} | {'P old/new':>9} | {'distinct/rank batch':>19} | {'open/rank':>9} | "
        f"worst node bytes / share, 1 rank a node, on W' = 2..8 dividing B (old -> new)"
    )
    for world in (1, 2, 3, 4, 8, 16):
        batch = 30 * world
        row = []
        plans = []
        for parts, window in (legacy_shape(batch, world), default_shape(batch, world, specs)):
            cfg = PlanConfig(
                seed=seed, global_batch_size=batch, num_partitions=parts, window=window
            )
            plans.append(EpochPlan(specs, cfg, 0))
            row.append(rank_metrics(plans[-1], 0, world))
        ratios = " ".join(
            f"{w}:{node_ratio(plans[0], w):.2f}->{node_ratio(plans[1], w):.2f}"
            for w in range(2, 9)
            if batch % w == 0
        )
        print(
            f"{world:>3} | {plans[0].config.num_partitions:>4}/"
            f"{plans[1].config.num_partitions:<4} | "
            f"{row[0][0]:>8.2f} -> {row[1][0]:<7.2f} | {row[0][1]:>3} -> {row[1][1]:<3} | {ratios}",
            flush=True,
        )
    print("resumed epoch, default shape of the first run, killed a third into the epoch:")
    print("old -> new nodes | rest of the epoch: bytes / share | whole epoch, nodes in both runs")
    for old, new, batch in ((3, 4, 120), (3, 2, 120), (4, 6, 120), (8, 5, 120), (8, 7, 56 * 8)):
        parts, window = default_shape(batch, old, specs)
        cfg = PlanConfig(seed=seed, global_batch_size=batch, num_partitions=parts, window=window)
        plan = EpochPlan(specs, cfg, 0)
        rest, epoch = resumed_epoch(plan, old, new, plan.num_batches // 3)
        print(f"{old:>3} -> {new:<3} (P={parts:>3}) | {rest:>12.2f} | {epoch:>12.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--samples-per-shard", type=int, default=32768)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--defaults", action="store_true", help="compare default plan shapes")
    args = parser.parse_args()
    if args.defaults:
        compare_defaults(args.shards, min(args.samples_per_shard, 4096), args.seed)
        return
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
