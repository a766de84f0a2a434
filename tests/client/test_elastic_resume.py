"""Elastic resume (DESIGN §3.6): a run started with default options continues on any world
size that divides its global batch, with any number of workers, from any checkpoint.

Plan level (hypothesis, many topologies): consuming a prefix on one (world, workers) and
the rest on another gives exactly the uninterrupted global batches, each rank an equal
share; nodes stay within the documented locality bound. Job level (slow): real gloo jobs
of separate rank processes, SIGKILLed mid-epoch and restarted on 3 -> 4 (from the
server's checkpoint), 3 -> 2, 4 -> 6 and 8 -> 5 ranks with other worker counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.api_client import APIClient
from shardstream.client.dataset import StreamingDataset
from shardstream.client.distributed import Topology
from shardstream.client.options import CacheOptions, DecodeOptions
from shardstream.client.resume import adopt_saved
from shardstream.mds import MDSIndex
from shardstream.plan import EpochPlan, PlanConfig, SourceSpec, default_shape
from shardstream.shard_builder.publish import register_index
from tests.fixtures.plans import I64, default_plan
from tests.fixtures.server import LiveServer
from tests.harness.compare import check_elastic_resume
from tests.harness.config import DataSettings, ServerResume, TrainerConfig
from tests.harness.datasets import write_id_dataset
from tests.harness.records import AttemptLog
from tests.harness.scenario import Killed, attempt, resume_state_dict, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def divisors(n: int, up_to: int = 64) -> list[int]:
    return [w for w in range(1, min(n, up_to) + 1) if n % w == 0]


def consume(plan: EpochPlan, world: int, workers: int, start: int, stop: int) -> list[I64]:
    """Per rank, what a job reads for global batches ``[start, stop)``: each rank's
    DataLoader round-robins over workers reading ``plan.worker_batches(start, w, n)``."""
    out = []
    for rank in range(world):
        streams = [iter(plan.worker_batches(start, w, workers)) for w in range(workers)]
        seq = [next(streams[i % workers]) for i in range(stop - start)]
        assert seq == list(range(start, stop)), "round-robin must yield batches in order"
        out.append(plan.rank_batches(np.array(seq, dtype=np.int64), rank, world))
    return out


@st.composite
def elastic_cases(draw: st.DrawFn) -> tuple[EpochPlan, int, int, int, int, int]:
    batch = draw(st.sampled_from([12, 24, 30, 36, 60, 120]))
    sizes = np.array(draw(st.lists(st.integers(1, 90), min_size=1, max_size=30)), dtype=np.int64)
    if sizes.sum() < batch:
        sizes[0] += batch
    before = draw(st.sampled_from(divisors(batch)))
    plan = default_plan(sizes, batch, before, draw(st.integers(0, 2**32)), draw(st.integers(0, 3)))
    after = draw(st.sampled_from(divisors(batch)))
    workers = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    cut = draw(st.integers(0, plan.num_batches))
    return plan, before, after, workers[0], workers[1], cut


@given(elastic_cases())
@SETTINGS
def test_any_world_and_worker_change_continues_the_global_order(
    case: tuple[EpochPlan, int, int, int, int, int],
) -> None:
    plan, before, after, k1, k2, cut = case
    first = consume(plan, before, k1, 0, cut)
    rest = consume(plan, after, k2, cut, plan.num_batches)
    # Equal batches per rank, before and after.
    assert {r.shape for r in first} <= {(cut, plan.config.global_batch_size // before)}
    assert {r.shape for r in rest} == {
        (plan.num_batches - cut, plan.config.global_batch_size // after)
    }
    # Global batch k is the same samples in the same order whatever the world size.
    got = np.concatenate(
        [np.concatenate(first, axis=1), np.concatenate(rest, axis=1)], axis=0
    ).ravel()
    np.testing.assert_array_equal(got, plan.global_batches(0, plan.num_batches))
    # Exactly once (tail="drop"): no sample consumed twice, before and after together.
    assert np.unique(got).size == got.size


@given(elastic_cases())
@SETTINGS
def test_rank_schedule_covers_every_resumed_read(
    case: tuple[EpochPlan, int, int, int, int, int],
) -> None:
    """On the new world size, each rank's prefetch list from the resume point lists every
    shard it reads (its slice may now straddle partitions)."""
    plan, _, after, _, _, cut = case
    if cut == plan.num_batches:
        return
    rest = np.arange(cut, plan.num_batches)
    for rank in range(after):
        needed = set(plan.locate(plan.rank_batches(rest, rank, after).ravel())[0].tolist())
        assert needed <= set(plan.rank_shards(rank, after, cut).tolist())


@given(elastic_cases(), st.sampled_from([1, 2, 3]))
@SETTINGS
def test_node_locality_on_any_node_count(
    case: tuple[EpochPlan, int, int, int, int, int], ranks_per_node: int
) -> None:
    """A node reads the shards of the partitions its slots touch: at most its share plus
    two partitions (one at each end, shared with a neighbour) plus the two shards cut at
    those ends; exactly its share plus two shards when the node count divides ``P``."""
    plan, _, after, _, _, _ = case
    batch, parts = plan.config.global_batch_size, plan.config.num_partitions
    if after % ranks_per_node:
        return
    nodes = after // ranks_per_node
    sizes, s = plan.shard_sizes, plan.partition_size
    share, max_shard = plan.num_positions // nodes, int(sizes.max())
    batches = np.arange(plan.num_batches)
    for node in range(nodes):
        ranks = range(node * ranks_per_node, (node + 1) * ranks_per_node)
        ids = np.concatenate([plan.rank_batches(batches, r, after).ravel() for r in ranks])
        read = int(sizes[np.unique(plan.locate(ids)[0])].sum())
        extra = 0 if parts % nodes == 0 else 2 * s
        assert read <= share + extra + 2 * max_shard, (node, nodes, parts, batch)


def test_default_shape_is_local_for_the_first_run_and_keeps_its_window() -> None:
    specs = [SourceSpec(shard_sizes=np.full(50, 1000))]
    assert default_shape(120, 3, specs) == (12, 4000)  # 4 partitions x 4 shards a rank
    assert default_shape(4, 1, specs) == (4, 8000)  # as before: 4 partitions x 8 shards
    assert default_shape(120, 8, specs) == (24, 8000 // 3)  # 15 a rank: 3 partitions
    assert default_shape(7, 7, specs) == (7, 8000)  # one sample a rank: one partition
    for batch, world in [(120, 3), (120, 8), (256, 16), (96, 1)]:
        assert default_shape(batch, world, specs)[0] % world == 0


def test_default_partitions_are_a_multiple_of_the_earlier_default() -> None:
    """Every node count that was exactly local under the earlier default stays so, and a
    rank's window (partitions x window) is what it was."""
    specs = [SourceSpec(shard_sizes=np.full(20, 100))]
    for batch in (1, 4, 12, 30, 64, 96, 120, 256, 360, 4096):
        for world in divisors(batch, 64):
            cap = max(8, world)
            earlier = max(
                p
                for p in range(1, min(cap, batch) + 1)
                if batch % p == 0 and (p % world == 0 or world % p == 0)
            )
            parts, window = default_shape(batch, world, specs)
            assert parts % earlier == 0 and parts % world == 0 and batch % parts == 0
            assert window is not None
            assert abs(window * parts // world - 800 * max(1, earlier // world)) < parts


def test_resumed_reader_adopts_the_saved_shape_unless_fixed() -> None:
    """A state written before the window had a default of its own (``window: None``, 6
    partitions for 3 ranks) resumes on its original order; a user's own value wins."""
    fresh = PlanConfig(global_batch_size=120, num_partitions=12, window=4000)
    old = {"num_partitions": 6, "window": None, "global_batch_size": 120}
    got = adopt_saved(fresh, old, {"num_partitions": None, "window": None})
    assert (got.num_partitions, got.window) == (6, None)
    got = adopt_saved(fresh, old, {"num_partitions": None, "window": 4000})
    assert (got.num_partitions, got.window) == (6, 4000)
    assert adopt_saved(fresh, old, {"num_partitions": 12, "window": 4000}) == fresh


@pytest.mark.parametrize(("before", "after"), [(3, 2), (2, 0)])
def test_stateful_dataloader_state_resumes_on_another_worker_count(
    tmp_path: Path, before: int, after: int
) -> None:
    """torchdata's loader only reloads its state with the same ``num_workers``; giving its
    state to the dataset instead continues on any worker count."""
    write_id_dataset(tmp_path / "data", 600)

    def dataset() -> StreamingDataset:
        return StreamingDataset(
            str(tmp_path / "data" / "index.json"),
            4,
            cache=CacheOptions(dir=tmp_path / "cache"),
            decode=DecodeOptions(sample_ids=True),
            topology=Topology(0, 1),
        )

    def ids(batch: dict[str, torch.Tensor]) -> list[int]:
        return [int(i) for i in batch["id"]]

    reference = [ids(b) for b in dataset()]
    first = StatefulDataLoader(dataset(), batch_size=None, num_workers=before)
    it = iter(first)
    head = [ids(next(it)) for _ in range(7)]
    state = first.state_dict()
    del it, first
    ds = dataset()
    ds.load_state_dict(state)
    rest = [ids(b) for b in StatefulDataLoader(ds, batch_size=None, num_workers=after)]
    assert head + rest == reference


def test_state_of_an_earlier_release_resumes_on_4_ranks(tmp_path: Path) -> None:
    """The issue's state: 3 ranks, the earlier default (6 partitions, ``window: None``).
    4 ranks with default options adopt it and read its global batches from the position."""
    write_id_dataset(tmp_path / "data", 2400)

    def dataset(rank: int, world: int) -> StreamingDataset:
        return StreamingDataset(
            str(tmp_path / "data" / "index.json"),
            120 // world,
            cache=CacheOptions(dir=tmp_path / "cache"),
            decode=DecodeOptions(sample_ids=True),
            topology=Topology(rank, world),
        )

    state = dataset(0, 3).state_dict()
    state["plan"].update(num_partitions=6, window=None)
    state["batch"] = 7
    # That release wrote format 1: no algorithm version, fingerprint or changes.
    for key in ("algorithm", "fingerprint", "changes"):
        state.pop(key, None)
    state["format"] = 1
    readers = [dataset(r, 4) for r in range(4)]
    for ds in readers:
        ds.load_state_dict(state)
    # Every rank's sequence from batch 7 on, rank after rank.
    got = np.concatenate([np.concatenate([b["id"].numpy() for b in ds]) for ds in readers])
    sizes = np.array([s.samples for s in readers[0].stream.sources[0].shards], dtype=np.int64)
    cfg = PlanConfig(seed=0, global_batch_size=120, num_partitions=6)
    plan = EpochPlan([SourceSpec(shard_sizes=sizes)], cfg, 0)
    want = np.concatenate(
        [plan.rank_batches(np.arange(7, plan.num_batches), r, 4).ravel() for r in range(4)]
    )
    np.testing.assert_array_equal(got, want)


# ---- real jobs ----------------------------------------------------------------------------

NUM_SAMPLES = 3600
GLOBAL_BATCH = 120  # divisible by 2, 3, 4, 5, 6 and 8
STEPS = NUM_SAMPLES // GLOBAL_BATCH  # 30
CKPT_EVERY = 5
KILL_AT = 12  # checkpoint 10 (15 if the ranks ran ahead); ranks hold after step 25
SEED = 77


@dataclass
class Jobs:
    root: Path
    index: MDSIndex

    def config(self, name: str, workers: int, **changes: object) -> TrainerConfig:
        base = TrainerConfig(
            attempt_dir=str(self.root / name),
            data=DataSettings(
                source=str(self.root / "data"),
                global_batch_size=GLOBAL_BATCH,
                seed=SEED,
                cache_dir=str(self.root / "cache"),
            ),
            num_workers=workers,
            checkpoint_every=CKPT_EVERY,
            step_sleep_s=0.02,
        )
        return attempt(base, name, **changes)

    def planned(self, first_world: int) -> AttemptLog:
        """The uninterrupted epoch of a run started on ``first_world`` ranks with default
        options, from the plan (tests/client/test_resume.py shows the loader delivers it)."""
        sizes = np.array([s.samples for s in self.index.shards], dtype=np.int64)
        plan = default_plan(sizes, GLOBAL_BATCH, first_world, SEED, 0)
        assert plan.num_batches == STEPS
        batches = {s: plan.global_batches(s - 1, s) for s in range(1, STEPS + 1)}
        return AttemptLog(attempt_dir=self.root / "plan", world_size=1, ranks=(batches,))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    root = tmp_path_factory.mktemp("elastic")
    yield Jobs(root=root, index=write_id_dataset(root / "data", NUM_SAMPLES))


def check_epoch(
    jobs: Jobs, first_world: int, killed: Killed, resumed: AttemptLog, step: int
) -> None:
    """The killed prefix + the resumed rest is the first run's planned epoch, exactly."""
    report = check_elastic_resume(
        jobs.planned(first_world), killed.log, resumed, step, GLOBAL_BATCH
    )
    assert report.total_steps == STEPS
    assert 0 < report.checkpoint_step < STEPS


@pytest.mark.slow
@pytest.mark.parametrize(
    ("before", "after"), [((3, 1), (2, 3)), ((4, 2), (6, 1)), ((8, 1), (5, 2))]
)
def test_default_options_resume_on_another_world_size(
    jobs: Jobs, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """SIGKILL ``before = (ranks, workers)`` mid-epoch, resume on ``after`` from the ranks'
    ``state_dict`` files (new rank r loads old rank r mod old world)."""
    name = f"w{before[0]}x{before[1]}-to-w{after[0]}x{after[1]}"
    killed_cfg = jobs.config(f"{name}-killed", before[1])
    killed = run_and_kill(killed_cfg, before[0], KILL_AT)
    resume = resume_state_dict(killed_cfg, killed)
    resumed = run_epoch(
        jobs.config(f"{name}-resumed", after[1], resume_state_dict=resume), after[0]
    )
    check_epoch(jobs, before[0], killed, resumed, killed.checkpoint_step)


@pytest.mark.slow
def test_default_options_resume_3_to_4_ranks_from_the_server(
    tmp_path: Path, live_server: LiveServer
) -> None:
    """The issue's case: 3 ranks with default options commit to the server, are killed,
    and 4 ranks resume from the server's latest checkpoint (``resume="latest"``)."""
    # Inside the test's directory: the server registers datasets under its storage roots.
    jobs = Jobs(root=tmp_path, index=write_id_dataset(tmp_path / "data", NUM_SAMPLES))
    with APIClient(live_server.url, live_server.token) as api:
        version = register_index(api, str(jobs.root / "data" / "index.json"), "elastic-ids")
        run = api.create_run([("elastic-ids", version.number)], global_batch_size=GLOBAL_BATCH)
    env = {"SHARDSTREAM_TOKEN": live_server.token}
    base = jobs.config("x", 2)
    data = dataclasses.replace(base.data, server=live_server.url, run_id=str(run.id))
    killed = run_and_kill(
        jobs.config("srv-w3-killed", 2, data=data, commit=True), 3, KILL_AT, env=env
    )
    with APIClient(live_server.url, live_server.token) as api:
        latest = api.latest_checkpoint(run.id)
    assert latest is not None and latest.sample_in_epoch == latest.step * GLOBAL_BATCH
    resumed_cfg = jobs.config("srv-w4-resumed", 1, data=data, resume_server=ServerResume())
    resumed = run_epoch(resumed_cfg, 4, env=env)
    check_epoch(jobs, 3, killed, resumed, latest.step)
