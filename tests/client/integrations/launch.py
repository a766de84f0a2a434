"""Launch a framework's training script on N ranks as ``torchrun`` would, on loopback only.

Each rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT``. The ranks are forked from one
launcher that imported the framework once (:mod:`tests.client.integrations.fork_ranks`:
the imports were most of each rank's CPU time); all of them (and their loader workers)
share the launcher's process group, so :meth:`RankJob.kill` SIGKILLs them at one instant,
as a preemption would (the same kill as :mod:`tests.harness.job`, for any script module).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.mds import MDSWriter
from tests.fixtures.netns import require_private_netns
from tests.harness.job import REPO_ROOT, free_port, live_group_members

LAUNCHER = "tests.client.integrations.fork_ranks"


class RankJob:
    """``module`` run on ``world_size`` ranks with ``cfg`` (written to the attempt folder).

    ``module`` has ``main(config_path) -> int`` and, optionally, ``preload()`` (its heavy
    imports, done once before the ranks are forked)."""

    def __init__(self, module: str, cfg: dict[str, Any], world_size: int) -> None:
        self.attempt = Path(cfg["attempt"])
        self.attempt.mkdir(parents=True, exist_ok=True)
        config = self.attempt / "config.json"
        config.write_text(json.dumps(cfg))
        if world_size > 1:
            require_private_netns("torch.distributed")
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.world_size = world_size
        with (self.attempt / "launcher.out").open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", LAUNCHER, module, str(config), str(world_size)],
                env=env,
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        self.pgid = self.proc.pid

    def wait_for_files(self, name: str, timeout: float = 600) -> None:
        """Block until every rank wrote ``{name}{rank}``; fail if a rank exits first."""
        deadline = time.monotonic() + timeout
        while not all((self.attempt / f"{name}{r}").exists() for r in range(self.world_size)):
            if self.proc.poll() is not None:
                self.kill()
                raise AssertionError(f"the ranks exited before {name}\n{self.outputs()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no {name} within {timeout}s\n{self.outputs()}")
            time.sleep(0.05)

    def wait(self, timeout: float = 600) -> None:
        """Wait for every rank to exit 0 (the launcher exits 1 at the first that fails)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout}s\n{self.outputs()}") from None
        if rc != 0:
            self.kill()
            raise AssertionError(f"the job failed ({rc})\n{self.outputs()}")
        self.kill()  # loader workers of finished ranks, if any are left

    def kill(self) -> None:
        """SIGKILL every rank and worker at once; return when none runs any more."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while alive := live_group_members(self.pgid):
            if time.monotonic() > deadline:
                raise AssertionError(f"processes {alive} survived SIGKILL")
            time.sleep(0.01)

    def outputs(self, tail: int = 4000) -> str:
        """The end of the launcher's and each rank's output, for failure messages."""
        names = ["launcher", *(f"rank{r}" for r in range(self.world_size))]
        return "\n".join(
            f"--- {name} ---\n" + _tail(self.attempt / f"{name}.out", tail) for name in names
        )

    def __enter__(self) -> RankJob:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None or live_group_members(self.pgid):
            self.kill()


def _tail(path: Path, chars: int) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no output)"


def steps_of(attempt: Path, world_size: int) -> dict[int, list[list[int]]]:
    """``{step: [ids of rank 0, ids of rank 1, ...]}`` from the ranks' logs."""
    steps: dict[int, list[list[int]]] = {}
    for rank in range(world_size):
        for line in (attempt / f"rank{rank}.log").read_text().splitlines():
            step, *ids = map(int, line.split())
            steps.setdefault(step, [[] for _ in range(world_size)])[rank] = ids
    return steps


def plan_batches(data: str, global_batch: int, steps: int, seed: int) -> dict[int, list[int]]:
    """The global batches (sample ids, sorted) of steps ``1..steps`` of an uninterrupted run,
    computed in this process: which samples a step reads is a pure function of the plan
    (data, seed, global batch), the same on any number of ranks, so the reference needs no
    framework and no process of its own. Read on one rank, across epoch ends, as a trainer's
    loop would."""
    from shardstream.client import (
        DecodeOptions,
        PlanOptions,
        ShardstreamLoader,
        StreamingDataset,
        Topology,
    )

    dataset = StreamingDataset(
        data, global_batch, plan=PlanOptions(seed=seed), decode=DecodeOptions(sample_ids=True),
        topology=Topology(rank=0, world_size=1),
    )  # fmt: skip
    out: dict[int, list[int]] = {}
    with ShardstreamLoader(dataset, num_workers=0, stats=False) as loader:
        while len(out) < steps:
            for batch in loader:
                out[len(out) + 1] = sorted(batch["sample_id"].tolist())
                if len(out) == steps:
                    break
    return out


def global_batches(steps: dict[int, list[list[int]]]) -> dict[int, list[int]]:
    """Each step's global batch (the ranks' samples together, sorted), after checking that
    the ranks read disjoint samples and none of them missed the step."""
    out = {}
    for step, per_rank in sorted(steps.items()):
        assert all(per_rank), f"step {step}: a rank logged no samples ({per_rank})"
        merged = [i for ids in per_rank for i in ids]
        assert len(set(merged)) == len(merged), f"step {step}: ranks overlap: {per_rank}"
        out[step] = sorted(merged)
    return out


def write_random_tokens(
    out: Path, samples: int, length: int, *, size_limit: int, seed: int
) -> Path:
    """An MDS dataset of ``samples`` rows of ``length`` random token ids (uint16 < 256) in
    shards of ``size_limit`` bytes: the data every integration test trains on."""
    rng = np.random.default_rng(seed)
    with MDSWriter(out, {"tokens": f"ndarray:uint16:{length}"}, size_limit=size_limit) as w:
        for _ in range(samples):
            w.write({"tokens": rng.integers(0, 256, length, dtype=np.uint16)})
    return out
