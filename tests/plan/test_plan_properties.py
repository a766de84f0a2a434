"""Property tests of the epoch plan (DESIGN §3) over random shard sizes, topologies, batch
sizes, seeds, epochs, windows and tail policies."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from shardstream.plan import EpochPlan, PlanConfig, SourceSpec, Tail

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@dataclass
class Case:
    sizes: NDArray[np.int64]
    cfg: PlanConfig
    epoch: int

    def __repr__(self) -> str:
        return f"Case(sizes={self.sizes.tolist()}, cfg={self.cfg}, epoch={self.epoch})"

    def plan(self) -> EpochPlan:
        return EpochPlan([SourceSpec(shard_sizes=self.sizes)], self.cfg, epoch=self.epoch)


@st.composite
def cases(draw: st.DrawFn, max_shards: int = 40) -> Case:
    parts = draw(st.sampled_from([1, 2, 4, 8]))
    q = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    sizes = np.array(
        draw(st.lists(st.integers(0, 60), min_size=1, max_size=max_shards)), dtype=np.int64
    )
    if sizes.sum() == 0:
        sizes[0] = 1
    tail: Tail = draw(st.sampled_from(["drop", "pad"]))
    if tail == "drop" and sizes.sum() < parts * q:
        sizes[0] += parts * q
    cfg = PlanConfig(
        seed=draw(st.integers(0, 2**40)),
        global_batch_size=parts * q,
        num_partitions=parts,
        shuffle=draw(st.booleans()),
        tail=tail,
        window=draw(st.one_of(st.none(), st.integers(1, 200))),
    )
    return Case(sizes, cfg, draw(st.integers(0, 5)))


def world_sizes(cfg: PlanConfig) -> list[int]:
    """Every world size the config supports up to 64: those dividing the batch size."""
    return [w for w in range(1, 65) if cfg.global_batch_size % w == 0]


@given(cases())
@SETTINGS
def test_exactly_once_with_tail(case: Case) -> None:
    plan = case.plan()
    m, positions = int(case.sizes.sum()), plan.num_positions
    order = plan.global_batches(0, plan.num_batches)
    assert order.size == positions
    counts = Counter(order.tolist())
    if case.cfg.tail == "drop":
        assert positions == m // case.cfg.global_batch_size * case.cfg.global_batch_size
        assert max(counts.values()) == 1, "a sample repeats within an epoch"
        assert m - positions < case.cfg.global_batch_size
    else:
        assert set(counts) == set(range(m)), "a sample is missing from a padded epoch"
        assert 0 <= positions - m < case.cfg.global_batch_size
        # Padding repeats whole wrap-arounds only: no sample more than ceil(positions/m).
        assert max(counts.values()) <= -(-positions // m)
    assert order.min() >= 0 and order.max() < m


@given(cases())
@SETTINGS
def test_every_rank_same_batches_and_ranks_tile_the_global_batch(case: Case) -> None:
    plan = case.plan()
    b_sz = case.cfg.global_batch_size
    batches = np.arange(plan.num_batches)
    full = plan.global_batches(0, plan.num_batches).reshape(plan.num_batches, b_sz)
    for world in world_sizes(case.cfg):
        per_rank = [plan.rank_batches(batches, r, world) for r in range(world)]
        for got in per_rank:
            assert got.shape == (plan.num_batches, b_sz // world)
        np.testing.assert_array_equal(np.concatenate(per_rank, axis=1), full)


@given(cases(), st.data())
@SETTINGS
def test_node_locality_bound(case: Case, data: st.DataObject) -> None:
    """A node reads a contiguous slice of the epoch's items: its distinct shards add up to
    at most its share plus two boundary shards (plus the pad wrap for the last node)."""
    plan = case.plan()
    cfg = case.cfg
    p = cfg.num_partitions
    nodes = data.draw(st.sampled_from([n for n in (1, 2, 4, 8) if p % n == 0]))
    ranks_per_node = data.draw(
        st.sampled_from([r for r in (1, 2, 3, 4) if cfg.global_batch_size % (nodes * r) == 0])
    )
    world = nodes * ranks_per_node  # need not divide P: the node's slots are whole partitions
    max_shard = int(case.sizes.max())
    batches = np.arange(plan.num_batches)
    node_items = plan.num_positions // nodes
    pad = plan.num_positions - plan.num_samples if cfg.tail == "pad" else 0
    seen_by_nodes: list[set[int]] = []
    for node in range(nodes):
        ranks = range(node * ranks_per_node, (node + 1) * ranks_per_node)
        ids = np.concatenate([plan.rank_batches(batches, r, world).ravel() for r in ranks])
        shards = set(plan.locate(ids)[0].tolist())
        seen_by_nodes.append(shards)
        node_bytes = int(case.sizes[list(shards)].sum())
        bound = node_items + 2 * max_shard + (pad + 2 * max_shard if node == nodes - 1 else 0)
        assert node_bytes <= bound
        # rank_shards lists (a superset of) what the ranks actually read.
        listed = set()
        for r in ranks:
            listed |= set(plan.rank_shards(r, world).tolist())
        assert shards <= listed
    # Only boundary shards are shared: a shard is read by at most the nodes its items cross.
    for shard in set().union(*seen_by_nodes) if pad == 0 else ():
        readers = sum(shard in s for s in seen_by_nodes)
        assert readers <= -(-int(case.sizes[shard]) // max(node_items, 1)) + 2


def test_locality_at_scale_within_ten_percent() -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(500, 1500, size=4000)
    for nodes, ranks_per_node, parts in [(8, 8, 64), (16, 4, 64), (32, 2, 64), (4, 8, 64)]:
        world = nodes * ranks_per_node
        cfg = PlanConfig(seed=1, global_batch_size=512, num_partitions=parts)
        plan = EpochPlan([SourceSpec(shard_sizes=sizes)], cfg, epoch=2)
        for node in (0, nodes // 2, nodes - 1):
            shards: set[int] = set()
            for r in range(node * ranks_per_node, (node + 1) * ranks_per_node):
                shards |= set(plan.rank_shards(r, world).tolist())
            ratio = sizes[list(shards)].sum() / (sizes.sum() / nodes)
            assert ratio <= 1.1, (nodes, ranks_per_node, node, ratio)


@given(cases(), st.data())
@SETTINGS
def test_resume_at_random_position_is_identical(case: Case, data: st.DataObject) -> None:
    plan = case.plan()
    world = data.draw(st.sampled_from(world_sizes(case.cfg)))
    start = data.draw(st.integers(0, plan.num_batches - 1))
    rank = data.draw(st.integers(0, world - 1))
    # A fresh plan built from the few integers of the state continues identically.
    resumed = EpochPlan(
        [SourceSpec(shard_sizes=case.sizes.copy())], PlanConfig(**vars(case.cfg)), case.epoch
    )
    assert resumed.fingerprint == plan.fingerprint
    rest = np.arange(start, plan.num_batches)
    np.testing.assert_array_equal(
        resumed.rank_batches(rest, rank, world), plan.rank_batches(rest, rank, world)
    )
    # The prefetch list from the resume point covers every shard still to be read.
    needed = set(plan.locate(plan.rank_batches(rest, rank, world).ravel())[0].tolist())
    assert needed <= set(resumed.rank_shards(rank, world, start).tolist())


def consume(plan: EpochPlan, world: int, workers: int, start: int, stop: int) -> NDArray[np.int64]:
    """What a training job reads for global batches [start, stop): every rank's DataLoader
    round-robins over its workers, each worker reading ``plan.worker_batches``."""
    out = []
    for rank in range(world):
        streams = [list(plan.worker_batches(start, w, workers)) for w in range(workers)]
        seq: list[int] = []
        i = 0
        while len(seq) < stop - start:
            seq.append(streams[i % workers][i // workers])
            i += 1
        assert seq == list(range(start, stop)), "round-robin must yield batches in order"
        out.append(plan.rank_batches(np.array(seq, dtype=np.int64), rank, world))
    return np.concatenate(out, axis=1).ravel()


@given(cases(), st.data())
@SETTINGS
def test_elastic_resume_keeps_global_order(case: Case, data: st.DataObject) -> None:
    """Consume a random prefix on (nodes, ranks per node, workers), resume the rest on
    another topology with the same global batch size: the concatenation is the
    uninterrupted global order, so every remaining sample is read once."""
    plan = case.plan()
    topologies = [
        (nodes, world // nodes)
        for world in world_sizes(case.cfg)
        for nodes in range(1, world + 1)
        if world % nodes == 0
    ]
    (n1, r1), (n2, r2) = (
        data.draw(st.sampled_from(topologies)),
        data.draw(st.sampled_from(topologies)),
    )
    k1, k2 = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    cut = data.draw(st.integers(0, plan.num_batches))
    # Ranks are numbered node-major (a node = ranks_per_node consecutive ranks), so the
    # job's reads in rank order are the plan's rank order whatever the node split.
    before = consume(plan, n1 * r1, k1, 0, cut)
    after = consume(plan, n2 * r2, k2, cut, plan.num_batches)
    uninterrupted = plan.global_batches(0, plan.num_batches)
    np.testing.assert_array_equal(np.concatenate([before, after]), uninterrupted)
    resumed_ids = set(after.tolist())
    assert len(resumed_ids) == after.size or case.cfg.tail == "pad"
    if case.cfg.tail == "drop":
        assert len(resumed_ids & set(before.tolist())) == 0


@given(cases())
@SETTINGS
def test_windows_bound_the_shards_open(case: Case) -> None:
    """Reading a partition in order, the shards open at once (first read done, last read
    still to come) are those of one window span: at most 2 * block / smallest shard + 2."""
    plan = case.plan()
    if not case.cfg.shuffle or case.cfg.tail == "pad":
        return  # storage order opens one shard at a time; padding re-reads early shards
    q = case.cfg.partition_batch_size
    smallest = int(case.sizes[case.sizes > 0].min())
    order = plan.global_batches(0, plan.num_batches).reshape(plan.num_batches, -1, q)
    for p in range(case.cfg.num_partitions):
        shards = plan.locate(order[:, p].ravel())[0]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i, s in enumerate(shards.tolist()):
            first.setdefault(s, i)
            last[s] = i
        delta = np.zeros(shards.size + 1, dtype=np.int64)
        for s, begin in first.items():
            delta[begin] += 1
            delta[last[s] + 1] -= 1
        assert np.cumsum(delta).max() <= 2 * plan.block // smallest + 2


@given(cases(), st.data())
@SETTINGS
def test_rank_schedule_brackets_every_read(case: Case, data: st.DataObject) -> None:
    """Every batch that reads a shard lies inside the shard's [first, last] from the
    schedule, and the schedule is in need order: a cache can follow it exactly."""
    plan = case.plan()
    world = data.draw(st.sampled_from(world_sizes(case.cfg)))
    rank = data.draw(st.integers(0, world - 1))
    start = data.draw(st.integers(0, plan.num_batches - 1))
    shards, first, last = plan.rank_schedule(rank, world, start)
    assert len(set(shards.tolist())) == shards.size
    assert np.all(np.diff(first) >= 0) and np.all(first <= last)
    assert first.size == 0 or (first.min() >= start and last.max() < plan.num_batches)
    where = {s: i for i, s in enumerate(shards.tolist())}
    rest = np.arange(start, plan.num_batches)
    used = plan.locate(plan.rank_batches(rest, rank, world))[0]
    for b, row in zip(rest.tolist(), used, strict=True):
        for s in set(row.tolist()):
            i = where[s]
            assert first[i] <= b <= last[i], (s, b, first[i], last[i])


@given(st.integers(1, 60), st.integers(1, 700), st.integers(0, 2**64 - 1))
@SETTINGS
def test_staggered_blocks_keep_items_within_two_plain_blocks(v: int, size: int, key: int) -> None:
    """The mixing stages form a bijection, and the item at any position comes from one of
    the (at most two) plain blocks its shifted block overlaps: one window of items."""
    from shardstream.plan._mixing import mix_positions, plain_blocks, shifted_blocks

    t = np.arange(size, dtype=np.int64)
    part = np.zeros(size, dtype=np.int64)
    x = mix_positions(t, part, v, size=size, key_a=key, key_b=key ^ 1)
    assert sorted(x.tolist()) == list(range(size))
    _, start, end = shifted_blocks(t, v, size)
    first_plain, last_plain = start // v, (end - 1) // v
    assert np.all(last_plain - first_plain <= 1)
    assert np.all((plain_blocks(x, v, size)[0] >= first_plain) & (x // v <= last_plain))
