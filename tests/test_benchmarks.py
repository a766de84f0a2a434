"""The benchmarks keep working: each runs end to end at a tiny size and its table is checked.

Numbers are not asserted (timings belong to the benchmark runs, not to tests); what is
asserted is that every phase ran the requests it should and that none failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _table(stdout: str) -> dict[tuple[str, str], list[float]]:
    """``(phase, metric) -> values per backend`` from the printed table."""
    rows: dict[tuple[str, str], list[float]] = {}
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("phase "))
    for line in lines[start + 1 :]:
        phase, metric = line[:22].strip(), line[23:49].strip()
        rows[(phase, metric)] = [float(v) for v in line[49:].split()]
    return rows


@pytest.mark.timeout(300)
def test_server_load_runs_every_phase_without_errors(postgres_server_url: str) -> None:
    ranks, shards, page, restarts, commits = 16, 50, 20, 2, 3
    cmd = [sys.executable, str(ROOT / "benchmarks" / "server_load.py"), "--ranks", str(ranks)]
    cmd += ["--shards", str(shards), "--page-size", str(page), "--presign", "4"]
    cmd += ["--restarts", str(restarts), "--commits", str(commits), "--rate", "400"]
    env = {**os.environ, "SHARDSTREAM_TEST_POSTGRES": postgres_server_url}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    table = _table(done.stdout)
    per_start_up = 2 + -(-shards // page)  # version, index pages, presign
    expected = {
        "start-up, saturated": ranks * restarts * per_start_up,
        "start-up at 400/s": ranks * restarts * per_start_up,
        "checkpoints": ranks * commits,
    }
    for phase, requests in expected.items():
        assert table[(phase, "requests")][:2] == [requests, requests], phase
        assert table[(phase, "errors")][:2] == [0.0, 0.0], (phase, done.stderr[-2000:])
        assert all(v > 0 for v in table[(phase, "req/s")][:2])


@pytest.mark.timeout(300)
def test_index_startup_opens_the_dataset_every_way() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "index_startup.py"), "--shards", "300"]
    cmd += ["--ranks", "2", "--database", "sqlite"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.split("open StreamingDataset by name", 1)[1].splitlines()[1:]
    names = [row[:40].strip() for row in rows if row.strip()]
    assert names == [
        "previous client, every rank",
        "cold node, 1 rank",
        "cold node, 2 ranks at once (slowest)",
        "restart (node cache)",
    ]
    assert all(float(row[40:].split()[0]) > 0 for row in rows if row.strip())
