"""Is training waiting for data? ``loader.stats()`` gives the right verdict for the right
reason: a fast loader reports near-zero wait, a slow store an I/O-bound job, a slow
transform a CPU-bound one (the rule is in :mod:`shardstream.client.batches.input_stats`)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data

from shardstream.api_client import APIClient
from shardstream.client import (
    CacheOptions,
    PlanOptions,
    ServerOptions,
    ShardstreamLoader,
    StreamingDataset,
)
from shardstream.client.batches.input_stats import (
    INPUT_BOUND_SHARE,
    LATENCY_BUCKETS_S,
    InputStats,
    SourceCounters,
    Verdict,
    percentiles,
    running_time,
    verdict,
)
from shardstream.errors import ConfigError
from shardstream.mds import MDSWriter
from shardstream.shard_builder.publish import register_index
from shardstream.storage import open_store
from shardstream.wire import InputStatsReport
from tests.fixtures.cloud_emulator import CloudEmulator
from tests.fixtures.cloud_emulator_fixture import _cloud_emulator_process, cloud_emulator
from tests.fixtures.datasets import write_tokens
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer

__all__ = ["_cloud_emulator_process", "cloud_emulator"]


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stats") / "ds"
    write_tokens(out, 400, size_limit=4000)
    return out


def _run(loader: ShardstreamLoader, step_s: float = 0.0, limit: int | None = None) -> InputStats:
    for i, _ in enumerate(loader):
        if step_s:
            time.sleep(step_s)
        if limit is not None and i + 1 >= limit:
            break
    return loader.stats()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fast_loader_reports_near_zero_wait(
    tokens_dir: Path, tmp_path: Path, workers: int
) -> None:
    ds = StreamingDataset(str(tokens_dir), 8, cache=CacheOptions(dir=tmp_path / "cache"))
    with ShardstreamLoader(ds, num_workers=workers) as warm:  # the cache warm: no cold start
        _run(warm)
    with ShardstreamLoader(ds, num_workers=workers) as loader:
        stats = _run(loader, step_s=0.03, limit=30)
    assert stats.batches == 29  # each pass's first batch is timed apart
    assert stats.wait_share < INPUT_BOUND_SHARE, stats.line()
    assert stats.verdict == Verdict.NOT_INPUT_BOUND, stats.line()
    assert stats.step_s >= 29 * 0.03
    assert sum(stats.latency_counts) == stats.batches
    assert stats.workers == workers
    if workers:
        assert stats.source.ring_occupancy is not None and stats.source.chunks > 0
    assert stats.source.cache_hits > 0


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU (or of its turn for one, on a busy machine)."""
    end = running_time() + seconds
    while running_time() < end:
        pass


def test_a_slow_transform_is_cpu_bound(tokens_dir: Path, tmp_path: Path) -> None:
    def slow(sample: dict[str, Any]) -> dict[str, Any]:
        _spin(0.004)
        return sample

    ds = StreamingDataset(
        str(tokens_dir),
        4,
        cache=CacheOptions(dir=tmp_path / "cache"),
        sample_transform=slow,
    )
    with ShardstreamLoader(ds, num_workers=1, prefetch=2) as loader:
        stats = _run(loader, limit=25)
    assert stats.wait_share >= INPUT_BOUND_SHARE, stats.line()
    assert stats.verdict == Verdict.CPU_BOUND, stats.line()
    assert stats.source.busy is not None and stats.source.busy >= 0.5


TOKENS = 256


@pytest.fixture
def remote_tokens(s3_bucket: S3Bucket, tmp_path: Path) -> str:
    """30 shards of ~16 KiB in the session's bucket: the index URL."""
    out = tmp_path / "remote"
    columns = {"id": "int", "tokens": f"ndarray:uint16:{TOKENS}"}
    with MDSWriter(out, columns, size_limit=16 << 10) as writer:
        for i in range(900):
            writer.write({"id": i, "tokens": np.full(TOKENS, i % 60000, np.uint16)})
    store = open_store(f"{s3_bucket.url}/remote")
    for path in sorted(out.iterdir()):
        store.upload(path, path.name)
    return f"{s3_bucket.url}/remote/index.json"


def test_a_slow_store_is_io_bound(
    remote_tokens: str,
    cloud_emulator: CloudEmulator,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", cloud_emulator.endpoint_url)
    cloud_emulator.configure(latency_s=0.3, conn_bytes_per_s=64 << 10)  # 0.25 s a shard more
    ds = StreamingDataset(
        remote_tokens, 30, cache=CacheOptions(dir=tmp_path / "cache"), plan=PlanOptions(seed=3)
    )
    with ShardstreamLoader(ds, num_workers=1) as loader:
        stats = _run(loader)
    assert stats.verdict == Verdict.IO_BOUND, stats.line()
    assert stats.source.storage_requests > 0 and stats.source.storage_bytes > 0
    assert stats.source.cache_misses > 0
    # What the store served, seen by the emulator, is what the loader counted.
    served = cloud_emulator.stats()
    assert stats.source.storage_requests <= served["requests"], (stats.source, served)


def test_stats_off_measures_nothing_and_says_so(tokens_dir: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(str(tokens_dir), 8, cache=CacheOptions(dir=tmp_path / "cache"))
    with ShardstreamLoader(ds, num_workers=1, stats=False) as loader:
        assert len(list(loader)) == len(loader)
        with pytest.raises(ConfigError, match="stats=False"):
            loader.stats()
    with pytest.raises(ConfigError, match="log_stats_every"):
        ShardstreamLoader(ds, log_stats_every=0)


def test_a_log_line_every_n_batches(
    tokens_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ds = StreamingDataset(str(tokens_dir), 8, cache=CacheOptions(dir=tmp_path / "cache"))
    with (
        caplog.at_level(logging.INFO, logger="shardstream.client.stats"),
        ShardstreamLoader(ds, num_workers=0, log_stats_every=10) as loader,
    ):
        _run(loader, limit=31)  # 30 timed batches
    lines = [r.getMessage() for r in caplog.records if r.name == "shardstream.client.stats"]
    assert len(lines) == 3, lines
    assert all(line.startswith("input: ") and "wait" in line for line in lines)


def test_the_log_line_is_shown_without_any_logging_set_up(tokens_dir: Path, tmp_path: Path) -> None:
    """A fresh interpreter with Python's default logging (WARNING only): the lines that
    ``log_stats_every`` asks for are on stderr all the same."""
    script = (
        "import sys\n"
        "from shardstream.client import CacheOptions, ShardstreamLoader, StreamingDataset\n"
        "ds = StreamingDataset(sys.argv[1], 8, cache=CacheOptions(dir=sys.argv[2]))\n"
        "with ShardstreamLoader(ds, num_workers=0, log_stats_every=10) as loader:\n"
        "    for i, _ in enumerate(loader):\n"
        "        if i == 30:\n"
        "            break\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tokens_dir), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("input: ")]
    assert len(lines) == 3, done.stderr
    assert all(" wait " in line and "batches)" in line for line in lines)


def test_the_commit_report_is_small_and_valid(tokens_dir: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(str(tokens_dir), 8, cache=CacheOptions(dir=tmp_path / "cache"))
    with ShardstreamLoader(ds, num_workers=1) as loader:
        report = _run(loader, limit=12).report(rank=3, world_size=8)
    checked = InputStatsReport.model_validate(report)
    assert checked.rank == 3 and checked.batches == 11
    assert len(checked.model_dump_json()) < 1024


def test_the_verdict_rule() -> None:
    assert verdict(3, 0.9, 0.1) == Verdict.UNKNOWN  # too few batches to say
    assert verdict(100, 0.05, 0.9) == Verdict.NOT_INPUT_BOUND
    assert verdict(100, 0.5, 0.9) == Verdict.CPU_BOUND
    assert verdict(100, 0.5, 0.1) == Verdict.IO_BOUND
    assert verdict(100, 0.5, None) == Verdict.IO_BOUND
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    counts[1], counts[5] = 90, 10  # 90 batches within 1 ms, 10 within 100 ms
    assert percentiles(counts) == [1.0, 100.0, 100.0]
    a = SourceCounters(storage_requests=2, build_s=1.0, build_cpu_s=0.25)
    assert (a + a).busy == 0.25 and (a + a - a) == a


def test_commits_carry_each_windows_figures_to_the_server(
    live_server: LiveServer, tmp_path: Path
) -> None:
    write_tokens(tmp_path / "ds", 64, size_limit=600)
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(tmp_path / "ds" / "index.json"), "tokens")
        run = api.create_run([("tokens", 1)], global_batch_size=4).id
    server = ServerOptions(url=live_server.url, token=live_server.token, run=run)
    ds = StreamingDataset(
        str(tmp_path / "ds"), 4, server=server, cache=CacheOptions(dir=tmp_path / "cache")
    )
    with ShardstreamLoader(ds, num_workers=1) as loader:
        for step, _ in enumerate(loader, start=1):
            time.sleep(0.002)
            if step % 5 == 0:
                loader.commit(step)
        loader.flush_commits()
        stats = loader.stats()
    with APIClient(live_server.url, live_server.token) as api:
        got = api.input_stats(run)
    assert [r.rank for r in got.ranks] == [0] and got.missing == [] and got.world_size == 1
    rank = got.ranks[0]
    assert rank.step == 15 and [s for s, _ in rank.history] == [5, 10, 15]
    # The windows add up to what the loader measured until its last commit (14 timed
    # batches: the first of the pass is timed apart), no window counted twice.
    assert rank.total.batches == 14 and rank.latest.batches == 5
    assert rank.total.batches <= stats.batches
    assert rank.total.cache_misses + rank.total.cache_hits > 0


def test_a_dataset_iterated_in_process_measures_too(tokens_dir: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(str(tokens_dir), 8, cache=CacheOptions(dir=tmp_path / "cache"))
    with pytest.raises(ConfigError, match="not iterated in this process"):
        ds.stats()
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for _ in loader:
        time.sleep(0.002)
    stats = ds.stats()
    assert stats.batches == len(ds) - 1 and stats.step_s > 0 and stats.verdict != "unknown"
    pickle.loads(pickle.dumps(ds))  # a DataLoader with spawned workers pickles it
