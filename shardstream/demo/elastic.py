"""The demo's elastic resume: a job on 2 ranks, SIGKILLed mid-epoch, resumed on 4 ranks.

The README's headline claim: an interrupted job resumes at the exact sample even on a
different number of nodes. Each rank is a node with its own shard cache (see
:mod:`shardstream.demo.elastic_job`); the job reads a whole epoch in a run of its own,
with default plan options, and its rank logs are checked against the uninterrupted
run's epoch (:mod:`shardstream.demo.elastic_check`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from shardstream.demo.console import follow, say
from shardstream.demo.elastic_check import ElasticEvidence, check_elastic, last_step, read_ids_log
from shardstream.errors import ShardstreamError

RANKS_BEFORE, RANKS_AFTER = 2, 4
"""Ranks of the job before and after the resume; both divide the global batch."""

WORKERS = {RANKS_BEFORE: 2, RANKS_AFTER: 1}
"""Loader workers per rank: their number changes too (4 in all either way)."""

EVIDENCE = "elastic-resume.json"


@dataclass(frozen=True)
class ElasticSetup:
    """What the elastic part reads: the published version, the run's parameters, and the
    uninterrupted run's epoch log to compare with."""

    work: Path
    dataset: str
    dataset_samples: int
    global_batch: int
    commit_every: int
    reference_epoch: Path


def _job(
    setup: ElasticSetup,
    run: str,
    ranks: int,
    *,
    commit_every: int,
    hold_at: int | None = None,
    resume: bool = False,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the job on ``ranks`` ranks; its rank logs and output go to ``elastic/N-ranks``."""
    folder = setup.work / "elastic" / f"{ranks}-ranks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "job.out", "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardstream.demo.elastic_job",
                *("--world-size", str(ranks), "--dataset", setup.dataset, "--run", run),
                *("--global-batch", str(setup.global_batch), "--workers", str(WORKERS[ranks])),
                *("--commit-every", str(commit_every), "--log-dir", str(folder)),
                *("--cache-dir", str(setup.work / "elastic" / "cache")),
                *(["--hold-at", str(hold_at)] if hold_at is not None else []),
                *(["--resume"] if resume else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # ranks and their workers: one group, one killpg
        )
    return proc, folder


def _logs(folder: Path, ranks: int) -> list[Path]:
    return [folder / f"rank{r}.log" for r in range(ranks)]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):  # it had exited, workers and all
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _latest_checkpoint(run: str) -> int:
    from shardstream.api_client import APIClient

    with APIClient() as api:  # SHARDSTREAM_SERVER / SHARDSTREAM_TOKEN, as the ranks use
        latest = api.latest_checkpoint(int(run))
    if latest is None:
        raise ShardstreamError(f"run {run} has no checkpoint on the server after the kill")
    return latest.step


def run_elastic(setup: ElasticSetup, run: str) -> ElasticEvidence:
    """Run the job on :data:`RANKS_BEFORE` ranks to mid-epoch, SIGKILL it, resume it on
    :data:`RANKS_AFTER` ranks from the server's checkpoint; write and return the check."""
    reference = read_ids_log(setup.reference_epoch)
    steps = len(reference)
    hold_at = steps // 2
    every = min(setup.commit_every, hold_at)  # a checkpoint before the kill, whatever the flag
    say(
        f"elastic resume: a new run reads the whole epoch on {RANKS_BEFORE} ranks (gloo "
        f"processes, each a node with its own shard cache and {WORKERS[RANKS_BEFORE]} loader "
        f"workers), is SIGKILLed mid-epoch and resumes on {RANKS_AFTER} ranks "
        f"({WORKERS[RANKS_AFTER]} worker each); the ranks read, they do not train"
    )
    proc, first = _job(setup, run, RANKS_BEFORE, commit_every=every, hold_at=hold_at)
    try:
        follow(
            lambda: last_step(_logs(first, RANKS_BEFORE)),
            f"interrupted on {RANKS_BEFORE} ranks",
            total=steps,
            stop_at=hold_at,
            proc=proc,
        )
        if proc.poll() is not None:
            raise ShardstreamError(
                f"the {RANKS_BEFORE}-rank job exited with {proc.returncode} before step "
                f"{hold_at}; see {first / 'job.out'}"
            )
    finally:
        _kill(proc)
    killed_at = last_step(_logs(first, RANKS_BEFORE))
    checkpoint = _latest_checkpoint(run)
    say(
        f"SIGKILLed all {RANKS_BEFORE} ranks and their loader workers at step {killed_at} of "
        f"{steps} (they waited there, so the kill lands mid-epoch); the run's last "
        f"checkpoint on the server: step {checkpoint}"
    )
    proc, second = _job(setup, run, RANKS_AFTER, commit_every=every, resume=True)
    try:
        follow(
            lambda: last_step(_logs(second, RANKS_AFTER)),
            f"resumed on {RANKS_AFTER} ranks",
            total=steps,
            start=checkpoint,
            proc=proc,
        )
        if proc.wait(600) != 0:
            raise ShardstreamError(
                f"the job resumed on {RANKS_AFTER} ranks exited with {proc.returncode}; "
                f"see {second / 'job.out'}"
            )
    finally:
        _kill(proc)
    evidence = check_elastic(
        reference,
        [read_ids_log(p) for p in _logs(first, RANKS_BEFORE)],
        [read_ids_log(p) for p in _logs(second, RANKS_AFTER)],
        checkpoint=checkpoint,
        killed_at=killed_at,
        global_batch=setup.global_batch,
        dataset_samples=setup.dataset_samples,
    )
    evidence.write(setup.work / EVIDENCE)
    return evidence


def report_elastic(evidence: ElasticEvidence) -> bool:
    """Print what the elastic resume read against the uninterrupted epoch; True if OK."""
    e = evidence
    dropped = e.dataset_samples - e.epoch_steps * e.global_batch
    say(
        f"elastic resume, {e.ranks_before} ranks -> {e.ranks_after} ranks: epoch 0 is "
        f"{e.epoch_steps} global batches of {e.global_batch} = "
        f"{e.epoch_steps * e.global_batch:,} samples ({dropped} of {e.dataset_samples:,} "
        "do not fill a batch: dropped)"
    )
    say(
        f"  read by {e.ranks_before} ranks, steps 1..{e.checkpoint}: "
        f"{e.samples_before:,} samples ({e.global_batch // e.ranks_before} per rank and step)"
    )
    say(
        f"  read by {e.ranks_after} ranks, steps {e.checkpoint + 1}..{e.epoch_steps}: "
        f"{e.samples_after:,} samples ({e.global_batch // e.ranks_after} per rank and step)"
    )
    if e.killed_at > e.checkpoint:
        say(
            f"  steps {e.checkpoint + 1}..{e.killed_at} ran before the kill too; not counted: "
            "the job resumed from its checkpoint"
        )
    say(
        f"  together: {e.samples_read:,} samples, {e.distinct:,} distinct; read twice: "
        f"{e.duplicates}, missing from the epoch: {e.missing}, not in the epoch: "
        f"{e.unexpected}"
    )
    say(f"  global batches 1..{e.epoch_steps}, sample ids in order:")
    resumed = f"{e.ranks_before} ranks, then {e.ranks_after} ranks"
    say(f"    {'uninterrupted run':<24} sha256 {e.digest_uninterrupted}")
    say(f"    {resumed:<24} sha256 {e.digest_resumed}")
    if e.ok:
        say(
            f"OK: resumed on {e.ranks_after} ranks instead of {e.ranks_before}, the job read "
            "every sample of the epoch exactly once, in the uninterrupted run's order"
        )
    else:
        shares = "" if e.equal_shares else "; a rank missed a step or read another share"
        say(
            "FAILED: the job resumed on another number of ranks did not read the "
            f"uninterrupted epoch exactly once{shares}"
        )
    return e.ok
