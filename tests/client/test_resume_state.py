"""The one resume state (client/state.py): what a resume is checked against, and how.

The failures the field reports, each refused before the first batch with one error naming
every difference: a state written by a client whose order algorithm differs, a state from
another dataset version or data, other plan parameters, a mix of two runs' worker states.
Explicitly accepted changes go through and are recorded in every later state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import shardstream.client.batches.stream as stream_module
import shardstream.client.resume as resume_module
from shardstream.client import CacheOptions, PlanOptions, StreamingDataset
from shardstream.client.state import STATE_FORMAT, ReaderState
from shardstream.errors import ResumeError
from shardstream.plan import PLAN_ALGORITHM
from tests.fixtures.datasets import ids_of, write_tokens

N = 240


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("resume-state") / "ds"
    write_tokens(out, N, size_limit=400)
    return out


@pytest.fixture(scope="module")
def other_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same number of samples cut into other shards: other data under the same name."""
    out = tmp_path_factory.mktemp("resume-state-other") / "ds"
    write_tokens(out, N, size_limit=900)
    return out


def make(path: Path, tmp: Path, batch: int = 4, **kw: object) -> StreamingDataset:
    kw.setdefault("cache", CacheOptions(dir=tmp / "cache"))
    return StreamingDataset(str(path / "index.json"), batch, **kw)  # type: ignore[arg-type]


def consumed_state(ds: StreamingDataset, batches: int) -> dict[str, object]:
    it = iter(ds)
    for _ in range(batches):
        next(it)
    return ds.state_dict()


def test_the_state_carries_everything_the_order_depends_on(data: Path, tmp_path: Path) -> None:
    state = consumed_state(make(data, tmp_path, plan=PlanOptions(seed=3)), 5)
    assert state["format"] == STATE_FORMAT and state["algorithm"] == PLAN_ALGORITHM
    assert state["batch"] == 5 and state["samples"] == 20
    assert isinstance(state["fingerprint"], str) and len(state["fingerprint"]) == 32
    plan = state["plan"]
    assert isinstance(plan, dict)
    for key in ("seed", "shuffle", "global_batch_size", "num_partitions", "window", "tail"):
        assert key in plan
    assert ReaderState.from_dict(state).to_dict() == state


def test_a_state_from_another_order_algorithm_is_refused(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Today's client writes the state; a client whose algorithm was bumped must refuse it.
    state = consumed_state(make(data, tmp_path), 3)
    for module in (stream_module, resume_module):  # the fingerprint's and the state's
        monkeypatch.setattr(module, "PLAN_ALGORITHM", PLAN_ALGORITHM + 1)
    newer = make(data, tmp_path)
    with pytest.raises(ResumeError, match=rf"algorithm: saved {PLAN_ALGORITHM}, now") as info:
        newer.load_state_dict(state)
    assert "allow_changes=['algorithm']" in str(info.value)


def test_every_difference_is_named_at_once(data: Path, tmp_path: Path) -> None:
    state = consumed_state(make(data, tmp_path, plan=PlanOptions(seed=1, tail="drop")), 2)
    other = make(data, tmp_path, plan=PlanOptions(seed=2, tail="pad", shuffle=False))
    with pytest.raises(ResumeError) as info:
        other.load_state_dict(state)
    message = str(info.value)
    assert "3 differences" in message
    for line in ("seed: saved 1, now 2", "tail: saved 'drop', now 'pad'", "shuffle: saved True"):
        assert line in message


def test_other_data_under_the_same_parameters_is_refused(
    data: Path, other_data: Path, tmp_path: Path
) -> None:
    # The same source name and parameters; the index's shards differ (the data was
    # rewritten under the reader): only the fingerprint can tell.
    state = consumed_state(make(data, tmp_path), 2)
    moved = make(other_data, tmp_path / "o")
    ours = moved.resume.state(0, 0)
    state["versions"] = list(ours.versions)
    state["plan"] = dict(ours.plan)
    with pytest.raises(ResumeError, match="fingerprint: saved"):
        moved.load_state_dict(state)


def test_an_accepted_change_resumes_and_is_recorded(data: Path, tmp_path: Path) -> None:
    state = consumed_state(make(data, tmp_path, plan=PlanOptions(seed=1)), 4)
    changed = make(data, tmp_path, plan=PlanOptions(seed=9))
    changed.load_state_dict(state, allow_changes=["seed"])
    first = next(iter(changed))
    assert ids_of(first)  # it reads, from batch 4 of the new order
    later = changed.state_dict()
    assert later["plan"]["seed"] == 9  # type: ignore[index]
    assert later["changes"] == [{"epoch": 0, "batch": 4, "changed": {"seed": [1, 9]}}]
    # The record survives the next resume, and a second change adds to it.
    again = make(data, tmp_path, plan=PlanOptions(seed=9))
    again.load_state_dict(later)
    assert again.state_dict()["changes"] == later["changes"]


def test_mixed_worker_states_of_two_runs_are_refused(data: Path, tmp_path: Path) -> None:
    def loader(seed: int) -> StatefulDataLoader:
        return StatefulDataLoader(
            make(data, tmp_path, plan=PlanOptions(seed=seed)), batch_size=None, num_workers=2
        )

    states = []
    for seed in (1, 2):
        run = loader(seed)
        it = iter(run)
        for _ in range(3):
            next(it)
        states.append(run.state_dict())
        del it, run
    mixed = states[0]
    snapshot = mixed["_snapshot"]["_worker_snapshots"]
    snapshot["worker_1"] = states[1]["_snapshot"]["_worker_snapshots"]["worker_1"]
    with pytest.raises(ResumeError, match="seed: saved"):
        make(data, tmp_path, plan=PlanOptions(seed=1)).load_state_dict(mixed)


def test_a_format_1_state_still_resumes(data: Path, tmp_path: Path) -> None:
    # What clients before the algorithm field wrote: read as algorithm 1, no fingerprint.
    ds = make(data, tmp_path)
    reference = [ids_of(b) for b in make(data, tmp_path)]
    state = ds.resume.state(0, 3).to_dict()
    legacy = {k: v for k, v in state.items() if k not in ("algorithm", "fingerprint")}
    legacy["format"] = 1
    ds.load_state_dict(legacy)
    assert [ids_of(b) for b in ds] == reference[3:]
    with pytest.raises(ResumeError, match="state format 3"):
        ds.load_state_dict({**state, "format": 3})
