"""``shardstream demo`` — the README's run command — works end to end on this machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_resumes_exactly(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardstream",
            "demo",
            "--workdir",
            str(tmp_path / "demo"),
            "--steps",
            "60",
            "--kill-at",
            "35",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    digests = re.findall(r"run\s+sha256 ([0-9a-f]{16})", out)
    assert len(digests) == 2 and digests[0] == digests[1], out
    assert "OK: the resumed run consumed exactly the same samples" in out
    killed = re.search(
        r"SIGKILLed the trainer and its workers at step (\d+); last checkpoint: step (\d+)", out
    )
    assert killed, out
    kill_step, checkpoint = int(killed[1]), int(killed[2])
    assert 35 <= kill_step < 60 and checkpoint == kill_step // 10 * 10  # mid-run, committed
    # the published version and the run's checkpoints live in the server's SQLite file
    assert (tmp_path / "demo" / "server").is_dir()
    # under the location the server chose: shards/<dataset>-<id>/v1
    assert len(list((tmp_path / "demo" / "shards").glob("kjv-*/v1/shard.*.mds"))) > 1
