"""The fast loader's workers never outlive the trainer, whatever the trainer does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from shardstream.mds import MDSWriter

TRAINER = textwrap.dedent(
    """
    import os, signal, sys
    from shardstream.client import ShardstreamLoader, StreamingDataset

    # Like Lightning: catch SIGTERM for a graceful shutdown (forked workers inherit it).
    signal.signal(signal.SIGTERM, lambda *_: None)
    loader = ShardstreamLoader(StreamingDataset(sys.argv[1], 8), num_workers=2)
    it = iter(loader)
    next(it)
    pids = [w.proc.pid for w in loader._pool.workers]
    print(" ".join(map(str, pids)), flush=True)
    if sys.argv[2] == "hang":
        signal.pause()
    sys.stdin.readline()  # the test has seen the workers alive
    # exit without closing the loader or finishing the pass
    """
)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    rng = np.random.default_rng(0)
    with MDSWriter(out, {"tokens": "ndarray:uint16:16"}, size_limit=1 << 12) as writer:
        for _ in range(512):
            writer.write({"tokens": rng.integers(0, 100, 16, dtype=np.uint16)})
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived the trainer"
        time.sleep(0.1)


def _start(dataset: Path, mode: str, tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(dataset), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.stdin.close()  # "exit" goes on (and exits) only now: the check above cannot race it
    return proc, pids


def test_trainer_with_a_sigterm_handler_exits_without_closing_the_loader(
    dataset: Path, tmp_path: Path
) -> None:
    proc, pids = _start(dataset, "exit", tmp_path)
    assert proc.wait(timeout=60) == 0
    _wait_gone(pids)


def test_workers_die_with_a_sigkilled_trainer(dataset: Path, tmp_path: Path) -> None:
    proc, pids = _start(dataset, "hang", tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    _wait_gone(pids)
