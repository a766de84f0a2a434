"""The client SDK's use of the metadata server for runs: registration and checkpoint commits.

Kept apart so that reading an ``index.json`` URL never needs the server or its client. Named
sources (a dataset on the server, pinned to a version) resolve in
:mod:`shardstream.client.sources.named`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shardstream.api_client import APIClient
from shardstream.client.committer import committer_for, existing_committer
from shardstream.client.options import ServerOptions
from shardstream.client.sources.named import api_client
from shardstream.errors import (
    AuthenticationError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    ResumeError,
)

if TYPE_CHECKING:
    from shardstream.client.dataset import StreamingDataset

__all__ = [
    "check_run",
    "commit_checkpoint",
    "flush_commits",
    "load_checkpoint",
]

log = logging.getLogger("shardstream.client")


def _run_of(server: ServerOptions) -> int:
    """The run id of ``server`` as a number (:class:`ConfigError` when none or not one)."""
    if server.run is None:
        raise ConfigError(
            "no run id: build the dataset with server=ServerOptions(run=RUN_ID) to commit or "
            "resume checkpoints on the server (create a run with APIClient.create_run)"
        )
    try:
        return int(server.run)
    except ValueError:
        raise ConfigError(
            f"ServerOptions.run must be the run's numeric id, got {server.run!r}"
        ) from None


def _run_id(dataset: StreamingDataset) -> tuple[APIClient, int]:
    server = dataset.server or ServerOptions()
    run = _run_of(server)
    return api_client(server.resolved_url(), server.resolved_token()), run


def check_run(server: ServerOptions) -> None:
    """Refuse, before any batch is read, a run id the server does not know or will not
    show this token: otherwise the first commit, possibly hours into training, would."""
    run = _run_of(server)
    url = server.resolved_url()
    where = f"run {run} on the server {url} (ServerOptions.run)"
    try:
        committer_for(url, server.resolved_token()).api.get_run(run)
    except NotFoundError:
        raise ConfigError(
            f"{where} does not exist: create the run first (APIClient.create_run) and pass its id"
        ) from None
    except PermissionDeniedError as exc:
        raise ConfigError(f"{where}: this token may not read the run ({exc})") from None
    except AuthenticationError as exc:
        raise ConfigError(f"{where}: the server refused the token ({exc})") from None


_SESSION = uuid.uuid4().hex[:16]
"""This training process, among the processes a run's checkpoints come from."""


def commit_checkpoint(
    dataset: StreamingDataset,
    step: int,
    state: dict[str, Any],
    *,
    wait: bool = False,
    stats: Mapping[str, Any] | None = None,
    attempt: int | None = None,
) -> None:
    """Store ``state`` as the run's data position at ``step`` (idempotent per step).

    Queued on this process's :class:`~shardstream.client.committer.CheckpointCommitter`
    and sent in the background; ``wait=True`` returns only once it is durable. Either
    way, an earlier commit's failure is raised here.

    Beside the state go the world size and this process's session id, so the server's
    console can mark where a run was resumed and where its number of ranks changed.
    ``stats`` (the rank's input figures since its previous commit) go beside the plan."""
    server = dataset.server or ServerOptions()
    run = _run_of(server)
    committer = committer_for(server.resolved_url(), server.resolved_token())
    plan = {**state, "world_size": dataset.topology.world_size, "session": _SESSION}
    done = committer.submit(
        run,
        step=step,
        epoch=state["epoch"],
        sample_in_epoch=state["samples"],
        plan=plan,
        stats=stats,
        attempt=attempt,
    )
    if wait:
        committer.flush()
        done.result()  # (flush raised it already if it failed)


def flush_commits(dataset: StreamingDataset, timeout: float | None = None) -> None:
    """Wait until the commits this process sent for ``dataset``'s server are durable."""
    server = dataset.server or ServerOptions()
    if server.run is None:
        return  # nothing was ever committed through this dataset
    committer = existing_committer(server.resolved_url(), server.resolved_token())
    if committer is not None:
        committer.flush(timeout)


def load_checkpoint(dataset: StreamingDataset, resume: str | int) -> dict[str, Any]:
    """The state committed at step ``resume`` (or the ``"latest"``) for the dataset's run."""
    return load_checkpoint_at(dataset, resume)[1]


def load_checkpoint_at(dataset: StreamingDataset, resume: str | int) -> tuple[int, dict[str, Any]]:
    """``(step, state)`` of the checkpoint at step ``resume`` (or the ``"latest"``); a step
    without a checkpoint is a :class:`ResumeError` naming the nearest steps that have one."""
    flush_commits(dataset)  # this process's own commits first: it reads what it wrote
    api, run = _run_id(dataset)
    with api:
        if resume == "latest":
            checkpoint = api.latest_checkpoint(run)
            if checkpoint is None:
                raise ResumeError(f"run {run} has no checkpoint on the server yet")
        elif isinstance(resume, int) and not isinstance(resume, bool):
            try:
                checkpoint = api.get_checkpoint(run, resume)
            except NotFoundError as exc:
                raise ResumeError(f"cannot resume at step {resume}: {exc}") from None
        else:
            raise ConfigError(f"resume must be 'latest' or a step number, got {resume!r}")
    state = dict(checkpoint.plan)
    if "format" not in state:  # committed by another tool: rebuild from the position
        stream = dataset.stream
        batch, rest = divmod(checkpoint.sample_in_epoch, stream.config.global_batch_size)
        if rest:
            raise ResumeError(
                f"run {run} step {checkpoint.step}: sample_in_epoch="
                f"{checkpoint.sample_in_epoch} is not a whole number of global batches"
            )
        state = dataset.resume.state(checkpoint.epoch, batch).to_dict()
    return checkpoint.step, state


ATTEMPT_ENV = "SHARDSTREAM_ATTEMPT"
"""Names this start of the job, the same on all its ranks (else derived, see below)."""

_JOB_ENV = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def attempt_key(world_size: int) -> str:
    """The key every rank of this start of the job registers its attempt under.

    ``$SHARDSTREAM_ATTEMPT`` when set; else a digest of what all ranks of one start share
    and a restart changes: torchrun's run id and restart count, SLURM's job, step and
    restart count, the rendezvous address and the world size. A single process with none
    of those is its own job (a random key). Not the resume point: ranks of one start that
    resume from different states must register under one key, so the server sees them
    disagree and refuses the start (rather than a stale rank registering a rollback of its
    own). A launcher started again by hand may give the new start the same ids: the server
    makes it a new attempt once the earlier one has committed (see docs/training.md).
    """
    given = os.environ.get(ATTEMPT_ENV)
    if given:
        return given[:64]
    if world_size == 1 and not any(os.environ.get(name) for name in _JOB_ENV):
        return "proc-" + uuid.uuid4().hex[:24]
    shared = [f"{name}={os.environ.get(name, '')}" for name in _JOB_ENV]
    shared.append(f"world={world_size}")
    return "job-" + hashlib.sha256("\0".join(shared).encode()).hexdigest()[:24]


def register_attempt(
    dataset: StreamingDataset, resumed: tuple[int | None, int, int] | None, workers: int
) -> int | None:
    """Register this start of the job in the run's ledger; returns its attempt number.

    ``resumed`` is ``(trainer step or None, epoch, batch)`` of the state the loader resumed
    from (None: a start from the beginning). The server refuses (:class:`ResumeError`,
    before the first batch) a resume point that is no checkpoint of the run, a trainer
    step whose checkpoint is at another position, ranks of one start that disagree, a
    fresh start of a run that has checkpoints, and a loader that reads other versions or
    global batches than the run was created with. A server without the ledger: None.
    """
    from shardstream.wire import AttemptCreate, ResumePoint

    server = dataset.server or ServerOptions()
    run = _run_of(server)
    stream = dataset.stream
    state = dataset.resume.state(0, 0)
    point = None
    if resumed is not None:
        step, epoch, batch = resumed
        point = ResumePoint(
            step=step, epoch=epoch, sample_in_epoch=batch * stream.config.global_batch_size
        )
    body = AttemptCreate(
        key=attempt_key(dataset.topology.world_size),
        world_size=dataset.topology.world_size,
        workers=workers,
        resume=point,
        algorithm=state.algorithm,
        fingerprint=state.fingerprint,
        changes=[dict(c) for c in dataset.resume.changes],
        versions=list(stream.versions),
        global_batch_size=stream.config.global_batch_size,
    )
    api = committer_for(server.resolved_url(), server.resolved_token()).api
    try:
        return api.register_attempt(run, body).number
    except ConflictError as exc:
        raise ResumeError(f"run {run} refuses this start: {exc}") from None
    except NotFoundError:
        api.get_run(run)  # a missing run is still an error...
        log.warning("the server at %s keeps no ledger of attempts", server.resolved_url())
        return None  # ...but a server from before the ledger is not
