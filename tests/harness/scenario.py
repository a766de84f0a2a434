"""Run whole attempts: to the end of the epoch, or until a step and then SIGKILL."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.harness.config import StateDictResume, TrainerConfig
from tests.harness.job import Job
from tests.harness.records import AttemptLog, complete_checkpoint_steps


@dataclass(frozen=True)
class Killed:
    """A SIGKILLed attempt: its logs and the newest checkpoint step all ranks completed."""

    log: AttemptLog
    checkpoint_step: int
    seconds: float


def attempt(cfg: TrainerConfig, name: str, **changes: object) -> TrainerConfig:
    """``cfg`` for a new attempt directory ``<cfg.attempt_dir>/../<name>`` with ``changes``."""
    attempt_dir = str(Path(cfg.attempt_dir).parent / name)
    return dataclasses.replace(cfg, attempt_dir=attempt_dir, **changes)  # type: ignore[arg-type]


def run_epoch(
    cfg: TrainerConfig,
    world_size: int,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    unset_env: Sequence[str] = (),
) -> AttemptLog:
    """Run the job to the end of the epoch; return every rank's log."""
    with Job(cfg, world_size, env=env, unset_env=unset_env) as job:
        job.wait(timeout)
    return AttemptLog.read(Path(cfg.attempt_dir), world_size)


def run_and_kill(
    cfg: TrainerConfig,
    world_size: int,
    kill_at_step: int,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    unset_env: Sequence[str] = (),
) -> Killed:
    """Run until every rank has logged ``kill_at_step``, then SIGKILL the whole job.

    Unless ``cfg`` sets its own, the ranks hold after step ``kill_at_step + 13`` (see
    :attr:`TrainerConfig.hold_after_step`), so the kill always lands mid-epoch.
    """
    if cfg.hold_after_step is None:
        cfg = dataclasses.replace(cfg, hold_after_step=kill_at_step + 13)
    start = time.monotonic()
    with Job(cfg, world_size, env=env, unset_env=unset_env) as job:
        job.wait_for_step(kill_at_step, timeout)
        job.kill()
    attempt_dir = Path(cfg.attempt_dir)
    log = AttemptLog.read(attempt_dir, world_size)
    steps = complete_checkpoint_steps(attempt_dir, world_size)
    assert steps, f"the killed job completed no checkpoint by step {log.last_common_step()}"
    return Killed(log=log, checkpoint_step=steps[-1], seconds=time.monotonic() - start)


def resume_state_dict(killed_cfg: TrainerConfig, killed: Killed) -> StateDictResume:
    """The resume setting that restarts from ``killed``'s newest complete checkpoint."""
    return StateDictResume(
        attempt_dir=killed_cfg.attempt_dir,
        step=killed.checkpoint_step,
        world_size=killed.log.world_size,
    )
