"""``shardstream import`` on the command line: a killed import resumes to the same bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shardstream.mds import load_index
from tests.builder.conftest import dir_bytes, read_with_ours
from tests.fixtures.build_runs import kill_when_journaled
from tests.fixtures.foreign_shards import webdataset_samples, write_webdataset


def build_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardstream", "import", *args, "--no-progress"]


def test_import_killed_and_rerun_matches_a_clean_import(tmp_path: Path) -> None:
    pattern = write_webdataset(tmp_path / "wds", webdataset_samples(600), per_shard=30)
    out, clean = tmp_path / "out", tmp_path / "clean"
    options = ("--shard-size", "6KB", "--allow-small-shards", "--workers", "2")
    args = build_cli("webdataset", pattern, "--output", str(out), *options)
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    killed_after = kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=10)
    assert not (out / "index.json").exists()  # a killed import never looks complete

    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "shards reused from an earlier run" in rerun.stderr
    reference = subprocess.run(
        build_cli("webdataset", pattern, "--output", str(clean), *options),
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reference.returncode == 0, reference.stderr
    assert "600 samples" in reference.stderr
    assert dir_bytes(out) == dir_bytes(clean)
    assert len(read_with_ours(out)) == 600
    assert len(load_index(clean / "index.json").shards) > killed_after + 5  # killed mid-way


def test_unknown_format_is_refused_by_the_parser(tmp_path: Path) -> None:
    run = subprocess.run(
        build_cli("petastorm", str(tmp_path), "--output", str(tmp_path / "o")),
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "invalid choice: 'petastorm'" in run.stderr


def test_ray_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    pattern = write_webdataset(tmp_path / "wds", webdataset_samples(20), per_shard=10)
    run = subprocess.run(
        build_cli("webdataset", pattern, "--output", str(tmp_path / "o"), "--ray", "local"),
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "--ray: imports run on this machine's cores" in run.stderr
    assert not (tmp_path / "o" / "index.json").exists()
