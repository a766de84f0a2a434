"""Committing a checkpoint and registering an attempt as use cases, called without HTTP:
what each writes, what a refusal keeps, and what is counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shardstream.errors import ConflictError, NotFoundError, PermissionDeniedError
from shardstream.server.auth import BOOTSTRAP_ADMIN, Principal
from shardstream.server.data import attempts as attempts_data
from shardstream.server.data import checkpoints as checkpoints_data
from shardstream.server.services import attempts, checkpoints, runs
from shardstream.server.services.checkpoints import CommitResult
from shardstream.server.services.parts import ServerParts
from shardstream.server.services.publish import publish
from shardstream.wire import AttemptCreate, CheckpointCreate, ResumePoint, RunCreate, Scope

from .conftest import make_draft

GBS = 4


def _run(parts: ServerParts, tmp_path: Path) -> int:
    number = make_draft(parts, tmp_path / "a", "a", shards=2)
    asyncio.run(publish(parts, BOOTSTRAP_ADMIN, "a", number))
    body = RunCreate.model_validate(
        {"sources": [{"dataset": "a", "version": number}], "global_batch_size": GBS}
    )
    with parts.write_sessions() as session:
        run = runs.create(session, body, who=BOOTSTRAP_ADMIN)
        session.commit()
    assert run.input is not None  # answered with its input verdict, as the routes are
    return run.id


def _state(step: int, attempt: int | None = None, **plan: object) -> CheckpointCreate:
    return CheckpointCreate(
        step=step,
        epoch=0,
        sample_in_epoch=step * GBS,
        plan={"versions": ["a@1"], **plan},
        attempt=attempt,
    )


def _commits(parts: ServerParts, label: str) -> float:
    sample = "shardstream_checkpoint_commits_total"
    value = parts.metrics.registry.get_sample_value(sample, {"result": label})
    return value or 0.0


def test_commit_creates_then_replays_and_counts(parts: ServerParts, tmp_path: Path) -> None:
    run_id = _run(parts, tmp_path)
    with parts.write_sessions() as session:
        made, result = checkpoints.commit(
            session, parts.metrics, run_id, _state(5), who=BOOTSTRAP_ADMIN
        )
        session.commit()
    assert (made.step, made.sample_in_epoch, result) == (5, 20, CommitResult.created)
    with parts.write_sessions() as session:
        again, result = checkpoints.commit(
            session, parts.metrics, run_id, _state(5, session="other rank"), who=BOOTSTRAP_ADMIN
        )
        session.commit()
    assert (again, result) == (made, CommitResult.unchanged)
    assert (_commits(parts, "created"), _commits(parts, "unchanged")) == (1, 1)
    with parts.read_sessions() as session:
        assert checkpoints_data.latest(session, run_id) == made


def test_a_refused_commit_keeps_only_its_refusal(parts: ServerParts, tmp_path: Path) -> None:
    run_id = _run(parts, tmp_path)
    start = AttemptCreate(key="job-1", world_size=1)
    with parts.write_sessions() as session:
        attempt, created = attempts.register(session, run_id, start, who=BOOTSTRAP_ADMIN)
        session.commit()
    assert created and attempt.number == 1
    with parts.write_sessions() as session:
        checkpoints.commit(session, parts.metrics, run_id, _state(5, 1), who=BOOTSTRAP_ADMIN)
        session.commit()
    moved = _state(5, 1).model_copy(update={"sample_in_epoch": 21})
    with parts.write_sessions() as session, pytest.raises(ConflictError) as refused:
        checkpoints.commit(session, parts.metrics, run_id, moved, who=BOOTSTRAP_ADMIN)
    assert refused.value.status == 409 and "step 5" in str(refused.value)
    assert _commits(parts, "conflict") == 1
    with parts.read_sessions() as session:
        assert checkpoints_data.latest(session, run_id).sample_in_epoch == 20
        row = attempts_data.get(session, run_id, 1)
        assert row is not None and row.refused == [[5, 0, 21]]  # kept for the audit


def test_commit_checks_the_datasets_it_names(parts: ServerParts, tmp_path: Path) -> None:
    run_id = _run(parts, tmp_path)
    other = Principal(name="other", scope=Scope.write, datasets=frozenset({"a"}))
    elsewhere = _state(5, versions=["secret@1"])
    with parts.write_sessions() as session, pytest.raises(PermissionDeniedError):
        checkpoints.commit(session, parts.metrics, run_id, elsewhere, who=other)
    assert _commits(parts, "conflict") == 0
    with parts.read_sessions() as session, pytest.raises(NotFoundError):
        checkpoints_data.latest(session, run_id)  # nothing was written


def test_ranks_that_disagree_dispute_their_attempt(parts: ServerParts, tmp_path: Path) -> None:
    run_id = _run(parts, tmp_path)
    with parts.write_sessions() as session:
        checkpoints.commit(session, parts.metrics, run_id, _state(5), who=BOOTSTRAP_ADMIN)
        session.commit()
    resume = ResumePoint(step=5, epoch=0, sample_in_epoch=20)
    first = AttemptCreate(key="job-2", world_size=2, resume=resume)
    with parts.write_sessions() as session:
        attempts.register(session, run_id, first, who=BOOTSTRAP_ADMIN)
        session.commit()
    with parts.write_sessions() as session:
        same, created = attempts.register(session, run_id, first, who=BOOTSTRAP_ADMIN)
    assert not created and same.number == 1
    odd = first.model_copy(update={"world_size": 3})
    with parts.write_sessions() as session, pytest.raises(attempts_data.DisputedError):
        attempts.register(session, run_id, odd, who=BOOTSTRAP_ADMIN)
    with parts.read_sessions() as session:
        row = attempts_data.get(session, run_id, 1)
        assert row is not None and row.disputed is not None and "world_size" in row.disputed
    with parts.write_sessions() as session, pytest.raises(ConflictError, match="disagree"):
        checkpoints.commit(session, parts.metrics, run_id, _state(6, 1), who=BOOTSTRAP_ADMIN)
