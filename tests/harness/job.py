"""Launch a real multi-process ``torch.distributed`` job, watch it, SIGKILL it.

Like ``torchrun``, :class:`Job` starts one process per rank with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free ``MASTER_PORT``.
All ranks share one new process group (rank 0 leads it), which the DataLoader workers they
fork inherit, so one ``os.killpg(pgid, SIGKILL)`` takes down every rank and every worker
at the same instant, as a node failure or a scheduler's preemption would.

::

    with Job(cfg, world_size=2) as job:
        job.wait_for_step(40, timeout=60)
        job.kill()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from tests.fixtures.netns import require_private_netns
from tests.harness.config import TrainerConfig
from tests.harness.records import done_path, last_step, log_path

REPO_ROOT = Path(__file__).resolve().parents[2]


class JobError(AssertionError):
    """The job failed, hung or ended before the expected point; carries the ranks' output."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def live_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that are still running (zombies do not count)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


class Job:
    """One launch of the harness trainer on ``world_size`` ranks (see module docstring).

    The ranks inherit this process's environment plus ``env``, minus ``unset_env`` (e.g.
    the AWS credentials, to prove that ranks read through presigned URLs only).
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        world_size: int,
        *,
        env: Mapping[str, str] | None = None,
        unset_env: Sequence[str] = (),
    ) -> None:
        self.cfg = cfg
        # torch's TCPStore would ask DNS for the name of every loopback peer (netns.py).
        require_private_netns("torch.distributed")
        self.world_size = world_size
        self.attempt_dir = Path(cfg.attempt_dir)
        self.attempt_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.attempt_dir / "config.json"
        cfg.write(config_path)
        inherited = {k: v for k, v in os.environ.items() if k not in set(unset_env)}
        base_env = {
            **inherited,
            **(env or {}),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),  # one node
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pgid = 0
        try:
            for rank in range(world_size):
                out = (self.attempt_dir / f"rank{rank}.out").open("wb")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.harness.trainer", str(config_path)],
                    env={**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    cwd=REPO_ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    # Rank 0 leads a new group; the others and all workers join it.
                    process_group=self.pgid,
                )
                out.close()
                self.procs.append(proc)
                if rank == 0:
                    self.pgid = proc.pid
        except BaseException:
            self.kill()
            raise

    def __enter__(self) -> Job:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Never leave a rank or worker behind, whatever happened in the test.
        if any(p.poll() is None for p in self.procs) or live_group_members(self.pgid):
            self.kill()

    def last_steps(self) -> list[int]:
        """The last complete step each rank has logged."""
        return [last_step(log_path(self.attempt_dir, r)) for r in range(self.world_size)]

    def wait_for_step(self, step: int, timeout: float, poll_s: float = 0.01) -> list[int]:
        """Block until every rank has logged ``step``; return the ranks' last steps then.

        Raises :class:`JobError` if a rank exits first (so the kill would not land
        mid-epoch) or ``timeout`` passes.
        """
        deadline = time.monotonic() + timeout
        while True:
            steps = self.last_steps()
            if min(steps) >= step:
                return steps
            if any(p.poll() is not None for p in self.procs):
                raise JobError(f"job ended before step {step} (at {steps})\n{self.outputs()}")
            if time.monotonic() > deadline:
                self.kill()
                raise JobError(f"no step {step} within {timeout}s (at {steps})\n{self.outputs()}")
            time.sleep(poll_s)

    def kill(self, timeout: float = 30.0) -> None:
        """SIGKILL every rank and worker at once; return when none of them runs any more."""
        if self.pgid:
            # ProcessLookupError: everything had exited already.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # a rank not in the group (only if Popen failed half-way)
            p.wait(timeout)
        deadline = time.monotonic() + timeout
        while self.pgid and (alive := live_group_members(self.pgid)):
            if time.monotonic() > deadline:
                raise JobError(f"processes {alive} of group {self.pgid} survived SIGKILL")
            time.sleep(0.01)

    def wait(self, timeout: float) -> None:
        """Wait for a clean finish of every rank; raise :class:`JobError` otherwise."""
        deadline = time.monotonic() + timeout
        for rank, p in enumerate(self.procs):
            try:
                rc = p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise JobError(
                    f"job did not finish within {timeout}s (steps {self.last_steps()})\n"
                    f"{self.outputs()}"
                ) from None
            if rc != 0:
                self.kill()
                raise JobError(f"rank {rank} exited with {rc}\n{self.outputs()}")
            if not done_path(self.attempt_dir, rank).exists():
                raise JobError(f"rank {rank} exited 0 without finishing\n{self.outputs()}")
        # Workers of a finished rank are gone too (the DataLoader shut them down).
        self.kill()

    def outputs(self, tail: int = 3000) -> str:
        """The end of every rank's stdout/stderr, for failure messages."""
        parts = []
        for r in range(self.world_size):
            text = (self.attempt_dir / f"rank{r}.out").read_text(errors="replace")
            parts.append(f"--- rank {r} output (last {tail} chars) ---\n{text[-tail:]}")
        return "\n".join(parts)
