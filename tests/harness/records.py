"""What a training job leaves on disk: per-rank sample logs and per-rank loader checkpoints.

Layout of one attempt directory (one launch of a job)::

    <attempt>/samples.rank<r>.log      one line per training step: "<step> <id> <id> ...\\n"
    <attempt>/ckpt/step<S>.rank<r>.pt   the loader's state_dict() after step S (torch.save)
    <attempt>/done.rank<r>              written when rank r finished its loop cleanly
    <attempt>/rank<r>.out               the rank's stdout + stderr

Steps count from 1: the line for step ``s`` holds the ids of the ``s``-th batch the training
loop consumed, so a checkpoint "after step S" is a loader position of S batches.

Each log line reaches the kernel with one ``write`` on an ``O_APPEND`` descriptor, so a
SIGKILL leaves whole lines only; a torn final line (no newline) is ignored by the reader
anyway, because that step never completed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

IdArray = npt.NDArray[np.int64]

_CKPT_RE = re.compile(r"^step(\d+)\.rank(\d+)\.pt$")


def log_path(attempt_dir: Path, rank: int) -> Path:
    """The sample log of ``rank`` in ``attempt_dir``."""
    return attempt_dir / f"samples.rank{rank}.log"


def rows_log_path(attempt_dir: Path, rank: int) -> Path:
    """The packed-rows log of ``rank`` (runs with read-time packing; same line format, the
    "ids" being :func:`tests.harness.loaders.packed_rows`)."""
    return attempt_dir / f"rows.rank{rank}.log"


def checkpoint_path(attempt_dir: Path, step: int, rank: int) -> Path:
    """The loader checkpoint that ``rank`` wrote after ``step``."""
    return attempt_dir / "ckpt" / f"step{step:06d}.rank{rank}.pt"


def done_path(attempt_dir: Path, rank: int) -> Path:
    """The marker ``rank`` writes after its loop finished without error."""
    return attempt_dir / f"done.rank{rank}"


class StepLogWriter:
    """Append-only writer of one rank's sample log; every line is one ``write`` syscall."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, step: int, ids: IdArray) -> None:
        """Record that training step ``step`` consumed the samples ``ids`` (in batch order)."""
        line = f"{step} {' '.join(map(str, ids.tolist()))}\n".encode()
        written = os.write(self._fd, line)
        if written != len(line):  # regular files do not short-write short lines; be sure
            raise OSError(f"short write to sample log: {written} of {len(line)} bytes")

    def close(self) -> None:
        """Close the log file."""
        os.close(self._fd)


def read_step_log(path: Path) -> dict[int, IdArray]:
    """Read one rank's log as ``{step: ids}``; steps must be consecutive and unique.

    A missing file reads as no steps (the rank died before its first step).
    """
    steps: dict[int, IdArray] = {}
    if not path.exists():
        return steps
    data = path.read_bytes()
    for lineno, raw in enumerate(data.split(b"\n")[:-1], start=1):  # last piece: torn/empty
        fields = raw.split()
        step = int(fields[0])
        if steps and step != max(steps) + 1:
            raise AssertionError(
                f"{path}:{lineno}: step {step} follows step {max(steps)}; a rank must log "
                "consecutive steps exactly once"
            )
        steps[step] = np.array([int(f) for f in fields[1:]], dtype=np.int64)
    return steps


def last_step(path: Path) -> int:
    """The last complete step in a rank's log (0 if none); cheap enough to poll."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    end = data.rfind(b"\n")
    if end < 0:
        return 0
    start = data.rfind(b"\n", 0, end) + 1
    return int(data[start:end].split(b" ", 1)[0])


@dataclass(frozen=True)
class AttemptLog:
    """The sample logs of every rank of one attempt: ``ranks[r][step] -> ids``."""

    attempt_dir: Path
    world_size: int
    ranks: tuple[dict[int, IdArray], ...]

    @classmethod
    def read(cls, attempt_dir: Path, world_size: int, *, rows: bool = False) -> AttemptLog:
        """Read the logs of ranks ``0 .. world_size - 1`` from ``attempt_dir`` (the
        packed-rows logs with ``rows``)."""
        path = rows_log_path if rows else log_path
        ranks = tuple(read_step_log(path(attempt_dir, r)) for r in range(world_size))
        return cls(attempt_dir=attempt_dir, world_size=world_size, ranks=ranks)

    def steps(self, rank: int) -> list[int]:
        """The steps rank ``rank`` completed, in order."""
        return sorted(self.ranks[rank])

    def first_step(self) -> int:
        """The first step every rank logged (all ranks must agree)."""
        firsts = {min(r) for r in self.ranks if r}
        if len(firsts) != 1 or not all(self.ranks):
            raise AssertionError(f"{self.attempt_dir}: ranks disagree on the first step {firsts}")
        return firsts.pop()

    def last_common_step(self) -> int:
        """The highest step that every rank completed (0 if some rank completed none)."""
        return min((max(r) if r else 0) for r in self.ranks)

    def rank_sequence(self, rank: int, first: int, last: int) -> IdArray:
        """Rank ``rank``'s consumed ids from step ``first`` to ``last`` inclusive, in order."""
        missing = [s for s in range(first, last + 1) if s not in self.ranks[rank]]
        if missing:
            raise AssertionError(
                f"{self.attempt_dir}: rank {rank} did not log steps {missing[:5]}..."
            )
        parts = [self.ranks[rank][s] for s in range(first, last + 1)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def global_batch(self, step: int) -> IdArray:
        """Global batch ``step``: every rank's batch of that step, concatenated in rank order."""
        return np.concatenate([self.ranks[r][step] for r in range(self.world_size)])


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint atomically: a temp file in the same folder, then ``os.replace``."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`."""
    import torch

    state: dict[str, Any] = torch.load(path, weights_only=False)
    return state


def complete_checkpoint_steps(attempt_dir: Path, world_size: int) -> list[int]:
    """Steps for which every rank ``0 .. world_size - 1`` has a checkpoint, ascending.

    A job killed while saving may have some ranks' files for the newest step and not
    others; like a trainer's checkpoint, only a step that every rank finished counts.
    """
    ckpt_dir = attempt_dir / "ckpt"
    if not ckpt_dir.is_dir():
        return []
    ranks_by_step: dict[int, set[int]] = {}
    for entry in ckpt_dir.iterdir():
        m = _CKPT_RE.match(entry.name)
        if m:
            ranks_by_step.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    full = set(range(world_size))
    return sorted(s for s, ranks in ranks_by_step.items() if ranks >= full)
