"""Resumes the field reports as silent, each refused before the first batch or flagged by
the audit, through the real client and a real server (issue 24).

A dataset of 64 token samples read in global batches of 4 (16 batches per epoch), one
batch per training step: the step's checkpoint is at sample ``4 * step``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, ServerOptions, ShardstreamLoader, StreamingDataset
from shardstream.errors import ConflictError, ResumeError
from shardstream.shard_builder.publish import register_index
from tests.fixtures.audit_cli import audit_cli
from tests.fixtures.datasets import write_tokens
from tests.fixtures.server import LiveServer

N = 64
B = 4


@pytest.fixture
def api(live_server: LiveServer) -> Any:
    with APIClient(live_server.url, live_server.token) as client:
        yield client


@pytest.fixture
def data(api: APIClient, tmp_path: Path) -> str:
    write_tokens(tmp_path / "ds", N, size_limit=600)
    register_index(api, str(tmp_path / "ds" / "index.json"), "tokens")
    return "tokens"


def new_run(api: APIClient) -> int:
    return api.create_run([("tokens", 1)], global_batch_size=B).id


def loader(
    live: LiveServer, run: int, tmp_path: Path, source: str = "tokens", **kw: Any
) -> ShardstreamLoader:
    server = ServerOptions(url=live.url, token=live.token, run=run)
    ds = StreamingDataset(source, B, server=server, cache=CacheOptions(dir=tmp_path / "cache"))
    return ShardstreamLoader(ds, num_workers=0, **kw)


def train(ld: ShardstreamLoader, first: int, last: int) -> None:
    """Steps ``first..last``, one batch each, a commit after each (a pass per epoch)."""
    it = iter(ld)
    for step in range(first, last + 1):
        if next(it, None) is None:  # the epoch ended: the next pass is the next epoch
            it = iter(ld)
            next(it)
        ld.commit(step)
    ld.flush_commits()


def test_resume_at_a_step_without_checkpoint_is_refused_naming_the_steps(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    run = new_run(api)
    with loader(live_server, run, tmp_path) as ld:
        it = iter(ld)
        for step in range(1, 7):
            next(it)
            if step % 2 == 0:
                ld.commit(step)
    with pytest.raises(ResumeError, match=r"step 5.*steps 2, 4 and 6"):
        loader(live_server, run, tmp_path, resume=5)
    # a restarted trainer that restored its model but not the loader
    with (
        loader(live_server, run, tmp_path) as fresh,
        pytest.raises(ResumeError, match="resumes none"),
    ):
        iter(fresh)


def test_model_step_restored_without_its_loader_state_is_refused(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    run = new_run(api)
    with loader(live_server, run, tmp_path) as ld:
        it = iter(ld)
        states = {}
        for step in range(1, 5):
            next(it)
            ld.commit(step)
            states[step] = ld.state_dict()
    # the trainer restored the model of step 2 beside the loader state of step 4
    with loader(live_server, run, tmp_path) as ld:
        ld.load_state_dict(states[4], step=2)
        with pytest.raises(ResumeError, match=r"trainer is at step 2.*step 4's position"):
            iter(ld)
    # the matching pair resumes, and the audit proves the history so far (the run is open
    # and inside its first epoch: exit 3, nothing wrong)
    with loader(live_server, run, tmp_path) as ld:
        ld.load_state_dict(states[2], step=2)
        train(ld, 3, 8)
    code, report = audit_cli(live_server, run)
    assert code == 3 and report["verdict"] == "proven_so_far" and report["ok"], report
    assert report["rollbacks"] == [{"attempt": 2, "from_step": 4, "to_step": 2}]


def test_a_loader_state_of_another_run_is_refused(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    """Same dataset, same plan: the state itself cannot tell; the ledger can."""
    one, two = new_run(api), new_run(api)
    with loader(live_server, one, tmp_path) as ld:
        train(ld, 1, 3)
        other = ld.state_dict()
    with loader(live_server, two, tmp_path) as ld:
        train(ld, 1, 1)
    with loader(live_server, two, tmp_path) as ld:
        ld.load_state_dict(other)  # step 3 of run one; run two has only step 1
        with pytest.raises(ResumeError, match=f"run {two} has no checkpoint at the loader"):
            iter(ld)


def test_plan_algorithm_bump_is_refused_or_recorded(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    run = new_run(api)
    with loader(live_server, run, tmp_path) as ld:
        train(ld, 1, 3)
        state = ld.state_dict()
    old = {**state, "algorithm": state["algorithm"] - 1}  # as if written before a bump
    with (
        loader(live_server, run, tmp_path) as ld,
        pytest.raises(ResumeError, match="algorithm"),
    ):
        ld.load_state_dict(old, step=3)
    with loader(live_server, run, tmp_path) as ld:
        ld.load_state_dict(old, step=3, allow_changes=["algorithm"])
        train(ld, 4, 6)
    report = api.audit_run(run)
    assert report["ok"], report["failures"]
    [change] = report["plan_changes"]
    assert change["attempt"] == 2 and "algorithm" in change["changed"]


def test_dataset_version_swapped_under_the_run_is_refused_or_flagged(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    register_index(api, str(tmp_path / "ds" / "index.json"), "tokens")  # tokens@2
    run = new_run(api)
    with loader(live_server, run, tmp_path, "tokens@1") as ld:
        train(ld, 1, 2)
        state = ld.state_dict()
    # the job comes back reading the dataset's latest version
    with (
        loader(live_server, run, tmp_path, "tokens") as ld,
        pytest.raises(ResumeError, match="versions"),
    ):
        ld.load_state_dict(state, step=2)
    # a start that reads another version from the beginning: refused before its first
    # batch too (the run names its versions; the audit flags clients before that check)
    swapped = new_run(api)
    with (
        loader(live_server, swapped, tmp_path, "tokens") as ld,
        pytest.raises(ResumeError, match=r"reads \['tokens@1'\], but this loader reads"),
    ):
        iter(ld)


def test_rollback_through_the_loader_is_allowed_and_recorded(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    run = new_run(api)
    with loader(live_server, run, tmp_path) as ld:
        train(ld, 1, 6)
    with loader(live_server, run, tmp_path, resume=3) as ld:  # e.g. a loss spike after 3
        train(ld, 4, 20)  # into epoch 1 (16 batches per epoch)
    report = api.audit_run(run)
    assert report["ok"], report["failures"]
    assert report["rollbacks"] == [{"attempt": 2, "from_step": 6, "to_step": 3}]
    assert report["epochs"][0]["complete"] and report["epochs"][0]["consumed_to"] == N
    assert [(h["attempt"], h["first_step"], h["last_step"]) for h in report["history"]] == [
        (1, 1, 3),
        (2, 4, 20),
    ]


def test_a_refused_commit_raises_in_that_commit(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    """The model restored from step 2 beside the loader's ``resume="latest"`` (step 4):
    the start's first commit waits for the server, so its refusal is raised by the commit
    that is wrong, before the trainer saves a model of that step (not one commit later)."""
    run = new_run(api)
    with loader(live_server, run, tmp_path) as ld:
        train(ld, 1, 4)
    with loader(live_server, run, tmp_path, resume="latest") as ld:
        it = iter(ld)
        next(it)  # the model's step 3
        with pytest.raises(ConflictError, match="resumed the data at step 4"):
            ld.commit(3)
    assert [a.refused for a in api.list_attempts(run)] == [None, [[3, 0, 20]]]


def test_a_loader_of_another_batch_size_is_refused_before_the_first_batch(
    live_server: LiveServer, api: APIClient, data: str, tmp_path: Path
) -> None:
    run = new_run(api)
    server = ServerOptions(url=live_server.url, token=live_server.token, run=run)
    ds = StreamingDataset("tokens", 2 * B, server=server, cache=CacheOptions(dir=tmp_path / "c"))
    with ShardstreamLoader(ds, num_workers=0) as ld, pytest.raises(ResumeError) as refused:
        iter(ld)
    assert f"global batches of {B} samples" in str(refused.value)
    assert f"global_batch_size is {2 * B}" in str(refused.value)


def test_ranks_of_one_launch_share_one_attempt_key_whatever_they_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The key is the launcher's, not the resume point's: a stale rank must collide with
    its start's other ranks (and be refused), not register a start of its own."""
    from shardstream.client._server import attempt_key

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.delenv("SHARDSTREAM_ATTEMPT", raising=False)
    first = attempt_key(3)
    assert attempt_key(3) == first and attempt_key(4) != first
    monkeypatch.setenv("MASTER_PORT", "29501")  # another launch
    assert attempt_key(3) != first
