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
    cmd += ["--canary", "5", "--canary-every-ms", "5", "--canary-warmup-s", "0.2"]
    cmd += ["--route-requests", "2"]
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
    assert table[("canary commits", "requests")][:2] == [5.0, 5.0]
    assert all(n > 0 for n in table[("health under load", "requests")][:2])
    phases = ("start-up + canary", "canary commits", "health under load", "route: version")
    for phase in (*phases, "route: presign"):
        assert table[(phase, "errors")][:2] == [0.0, 0.0], (phase, done.stderr[-2000:])
    for route in ("route: version", "route: index page", "route: presign"):
        assert table[(route, "requests")][:2] == [ranks * 2.0] * 2, route


@pytest.mark.timeout(300)
def test_commit_burst_makes_every_rank_durable(postgres_server_url: str) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "commit_burst.py"), "--ranks", "32"]
    cmd += ["--sdk-ranks", "2", "--processes", "2", "--warmup-s", "1"]
    env = {**os.environ, "SHARDSTREAM_TEST_POSTGRES": postgres_server_url}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        line[:24].strip(): [float(v) for v in line[24:].split()]
        for line in done.stdout.split("CPUs\n", 1)[1].splitlines()[1:]
        if line.strip()
    }
    assert rows["ranks"] == [34.0, 34.0]
    assert rows["201 new"] == [4.0, 4.0] and rows["200 replay"] == [28.0, 28.0]
    assert rows["errors"] == [0.0, 0.0]
    assert all(v > 0 for v in rows["all durable s"])


@pytest.mark.timeout(300)
def test_ledger_commits_every_step_and_proves_the_run(postgres_server_url: str) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "ledger.py"), "--ranks", "16"]
    cmd += ["--steps", "3", "--audit-steps", "2000", "--processes", "2", "--warmup-s", "1"]
    env = {**os.environ, "SHARDSTREAM_TEST_POSTGRES": postgres_server_url}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]  # it fails unless the audit proves the run
    rows = {
        line[:28].strip(): [float(v) for v in line[28:].split() if v != "-"]
        for line in done.stdout.split("CPUs\n", 1)[1].splitlines()[1:]
        if line.strip()
    }
    assert rows["requests"] == [48.0, 48.0]
    assert rows["201 new"] == [3.0, 3.0] and rows["200 replay"] == [45.0, 45.0]
    assert rows["errors"] == [0.0, 0.0]
    assert rows["audited steps"] == [2000.0, 2000.0]
    assert all(v > 0 for v in rows["bytes/step"] + rows["audit s"])


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


@pytest.mark.timeout(600)
def test_cloud_read_runs_every_reader_through_the_emulator(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cloud_read.py"), "--shard-mb", "0.25"]
    cmd += ["--shards", "4", "--nodes", "2", "--modes", "cache,cacheless", "--slowdown", "0.3"]
    cmd += ["--peers", "mosaic,litdata,lancedb-inline"]
    cmd += ["--dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout, done.stdout[-3000:]
    after = done.stdout.split("| dataset | reader |", 1)[1].splitlines()[2:]
    table = [line for line in after if line.startswith("| ")]
    rows = {cells[1]: cells[2:] for cells in (line.split(" | ") for line in table)}
    # The closing lines: each shardstream row's ratio to MosaicML, with its first batch.
    ratios = [line for line in after if "x MosaicML's samples/s, first batch" in line]
    assert any(line.startswith("0.25mb-x4 shardstream cache: ") for line in ratios), after
    modes = ["cache"] + (["cacheless"] if "mode 'cacheless' skipped" not in done.stdout else [])
    once = [f"shardstream {m}{who}" for m in modes for who in ("", " (MosaicML-written)")]
    once += ["mosaic (S3 remote)", "litdata (S3 remote)", "lancedb-inline (S3 remote)"]
    expected = once + [f"{label}, no reuse" for label in once]  # --reuse on,off by default
    expected += [f"shardstream {m}, resumed at 90%" for m in modes]
    expected += ["shardstream cache, 30% SlowDown", "shardstream cache, 2 nodes"]
    expected += ["shardstream cache, stats off"]  # the input figures' cost (issue 27)
    assert sorted(rows) == sorted(expected), done.stdout
    for label, cells in rows.items():
        first_batch, samples_s, fetched, requests = (
            cells[i].replace(",", "") for i in (0, 1, 5, 6)
        )
        assert float(first_batch) > 0 and int(requests) > 0, label
        if "resumed" not in label:  # a whole epoch: every byte came through the emulator
            assert float(samples_s) > 0 and float(fetched) >= 0.99, (label, cells)
            # Every reader's batches were traced to the dataset's 4 shards (shards/batch).
            assert 1.0 <= float(cells[-1].rstrip(" |")) <= 4.0, (label, cells)
        else:  # one batch: no rates
            assert samples_s == "-" and cells[-1].rstrip(" |") == "-", (label, cells)
    # The injected SlowDowns were answered (the emulator's seeded rolls make the 4th request
    # of that run one) and the epoch still completed.
    assert int(rows["shardstream cache, 30% SlowDown"][7]) >= 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
def test_import_compares_every_format_with_its_library(cold: bool) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "import.py"), "--samples", "300"]
    cmd += ["--payload", "256", "--repeat", "1", *(["--cold"] if cold else [])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    head, _, *lines = done.stdout.splitlines()
    assert ("source on disk (cold)" in head) == cold, head
    rows = [line.split() for line in lines if line.strip()]
    assert sorted({r[0] for r in rows}) == ["hf", "litdata", "lmdb", "tfrecord", "webdataset"]
    assert all(r[-1].endswith("x") and float(r[-1][:-1]) > 0 for r in rows), done.stdout


@pytest.mark.timeout(400)
def test_read_images_runs_every_reader_and_the_decode_limit(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "read_images.py"), "--images", "320"]
    cmd += ["--repeats", "1", "--dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=380, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout, done.stdout
    table = done.stdout.split("\nreader ", 1)[1].splitlines()[1:]
    rows = {line[:34].strip(): line[34:].split() for line in table if line[:34].strip()}
    readers = [
        "shardstream ShardstreamLoader",
        "shardstream + torch DataLoader",
        "shardstream, Pillow decoder",
        "MosaicML StreamingDataset",
        "LitData StreamingDataset",
        "decode limit (process pool)",
    ]
    assert list(rows)[: len(readers)] == readers, done.stdout
    for name in readers:
        assert float(rows[name][0].replace(",", "")) > 0, done.stdout  # images/s
    # Every shardstream reader mixes across the whole dataset: about the classes a uniform
    # shuffle puts in a batch of 64 (47.4 of 100), not the few of one shard.
    for name in readers[:3]:
        assert float(rows[name][-1]) > 35, done.stdout


@pytest.mark.timeout(300)
def test_pack_compares_every_packer_on_the_same_documents() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "pack.py"), "--docs", "300"]
    cmd += ["--groups", "16,64", "--seq-len", "256"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("packer "))
    table = {line[:40].strip(): line[40:].split() for line in lines[start + 1 :] if line.strip()}
    names = list(table)
    assert names[:4] == [
        "stream greedy (ref)",
        "stream first_fit (ref)",
        "first-fit 8 bins (ref)",
        "grain first-fit 8 bins",  # Grain's own FirstFitPackIterDataset (a dev dependency)
    ]
    assert float(table["grain first-fit 8 bins"][2]) == 0.0  # pieces stay whole: nothing cut
    # LanceDB's own packing loader on the same documents: one split cuts the joined stream
    # into the fewest rows (nothing left out); eight splits each emit their fixed share.
    lance = [n for n in names if n.startswith("lancedb ")]
    assert lance == ["lancedb pack_sequences splits=1", "lancedb pack_sequences splits=8"]
    assert float(table[lance[0]][2]) == 0.0 and float(table[lance[0]][1]) < 1.0
    assert int(table[lance[1]][0].replace(",", "")) % 8 == 0
    for group in (16, 64):
        for method in ("greedy", "first_fit"):
            assert f"ours G={group} {method} rows=auto" in table
            assert any(
                n.startswith(f"ours G={group} {method} rows=") and "auto" not in n for n in names
            )
        auto = {m: table[f"ours G={group} {m} rows=auto"] for m in ("greedy", "first_fit")}
        # Rows as needed truncate nothing, and first fit never needs more rows than greedy.
        assert float(auto["greedy"][2]) == float(auto["first_fit"][2]) == 0.0
        assert int(auto["first_fit"][0].replace(",", "")) <= int(auto["greedy"][0].replace(",", ""))
    for values in table.values():
        rows, pad, trunc = int(values[0].replace(",", "")), float(values[1]), float(values[2])
        assert rows > 0 and 0.0 <= pad < 100.0 and 0.0 <= trunc < 100.0


@pytest.mark.timeout(400)
def test_read_runs_lancedb_beside_ours_on_the_same_rows(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "read.py"), "--samples", "256"]
    cmd += ["--no-cold", "--peers", "lancedb", "--dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=380, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stdout, done.stdout
    table = done.stdout.split("\nreader ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = {(line[:40].strip(), line[41:49].strip()): line[49:].split() for line in table}
    # Every reader read the whole epoch (read.py asserts the sample counts); the peers not
    # asked for are left out.
    assert sorted(rows) == sorted(
        [
            ("LanceDB StreamingDataset", "warm"),
            ("shardstream ShardstreamLoader", "warm"),
            ("shardstream ShardstreamLoader stats=off", "warm"),
            ("shardstream + torch DataLoader", "warm"),
            ("page-cache read of the shard files", "limit"),
        ]
    ), done.stdout
    assert float(rows[("LanceDB StreamingDataset", "warm")][0].replace(",", "")) > 0


@pytest.mark.timeout(300)
def test_resume_cost_resumes_both_ways_on_the_same_first_batch() -> None:
    """The Trainer's replay and shardstream's state start on the same batch (the replay
    once read its batch size from the checkpoint, 8, and skipped 8 x N batches)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "resume_cost.py"), "--steps", "3", "12"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [(r[1].strip(), r[4].strip()) for r in rows[2:]] == [("3", "True"), ("12", "True")]
