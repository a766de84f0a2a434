"""Mixture schedules through the reader: the weights change at the schedule's steps, the
schedule is a plan parameter of the resume state, and a resume across a schedule boundary
on another world size (plain or packed batches) continues with exactly the batches an
uninterrupted run reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PackOptions,
    PlanOptions,
    ServerOptions,
    ShardstreamLoader,
    StreamingDataset,
    Topology,
)
from shardstream.errors import ConfigError, ResumeError
from shardstream.plan import MixtureSchedule, Phase
from shardstream.shard_builder.publish import register_index
from tests.fixtures.datasets import write_documents, write_tokens
from tests.fixtures.server import LiveServer

GLOBAL_BATCH = 8
SCHEDULE = MixtureSchedule(
    [
        Phase(until=6, weights=(1.0, 0.0)),  # web only
        Phase(until=14, weights=(3.0, 1.0), end_weights=(1.0, 3.0), steps=4),  # 8-step ramp
        Phase(weights=(1.0, 3.0)),
    ]
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two document sources: ``web`` (tokens < 10**6) and ``code`` (tokens >= 10**6), each
    document's tokens telling its source, id and position."""
    out = []
    rng = np.random.default_rng(11)
    for s, name in enumerate(("web", "code")):
        path = tmp_path_factory.mktemp(name)
        write_documents(path, s, rng)
        out.append(str(path))
    return out


def _dataset(
    sources: list[str], cache: Path, world: int, rank: int, *, pack: PackOptions | None = None,
    schedule: MixtureSchedule | None = SCHEDULE,
) -> StreamingDataset:  # fmt: skip
    return StreamingDataset(
        sources,
        batch_size=GLOBAL_BATCH // world,
        plan=PlanOptions(seed=4, num_partitions=2, schedule=schedule),
        cache=CacheOptions(dir=cache),
        decode=DecodeOptions(sample_ids=True),
        topology=Topology(rank=rank, world_size=world),
        pack=pack,
    )


def _steps(
    sources: list[str], cache: Path, world: int, pack: PackOptions | None,
    state: dict[str, Any] | None = None,
) -> list[dict[str, np.ndarray[Any, Any]]]:  # fmt: skip
    """Every global step's batch (ranks concatenated), from ``state`` when given."""
    per_rank = []
    for rank in range(world):
        ds = _dataset(sources, cache, world, rank, pack=pack)
        if state is not None:
            ds.load_state_dict(state)
        per_rank.append([{k: _np(k, v) for k, v in b.items() if k != "cu_seqlens"} for b in ds])
    return [
        {k: _concat([b[k] for b in batches]) for k in batches[0]}
        for batches in zip(*per_rank, strict=True)
    ]


def _np(key: str, value: Any) -> Any:
    """A column as numpy; unpacked documents as a list of arrays (a batch whose documents
    happen to have one length comes as one 2-D tensor)."""
    return [t.numpy() for t in value] if key == "tokens" else value.numpy()


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], list):
        return [t for part in parts for t in part]
    return np.concatenate(parts)


def test_the_weights_change_at_the_scheduled_steps(sources: list[str], tmp_path: Path) -> None:
    steps = _steps(sources, tmp_path / "c", 1, None)
    code = [int((np.concatenate(list(s["tokens"])) >= 10**6).any()) for s in steps]
    share = [sum(int(t[0] >= 10**6) for t in s["tokens"]) / GLOBAL_BATCH for s in steps]
    assert code[:6] == [0] * 6  # phase 1: web only
    assert sum(share[6:10]) / 4 < sum(share[10:14]) / 4  # the ramp moves towards code
    assert sum(share[14:]) / len(share[14:]) == pytest.approx(0.75, abs=0.02)


@pytest.mark.parametrize("pack", [None, PackOptions(seq_len=48, rows=3, group=2)])
def test_resume_across_a_boundary_on_other_world_sizes(
    sources: list[str], tmp_path: Path, pack: PackOptions | None
) -> None:
    cache = tmp_path / "c"
    full = _steps(sources, cache, 1, pack)
    for cut in (5, 6, 7, 13, 14):  # just before, at and after the schedule's boundaries
        ds = _dataset(sources, cache, 2, 1, pack=pack)
        it = iter(ds)
        for _ in range(cut):
            next(it)
        state = ds.state_dict()
        assert state["batch"] == cut and state["plan"]["schedule"] == SCHEDULE.to_params()
        for world in (1, 4):
            rest = _steps(sources, cache, world, pack, state)
            assert len(rest) == len(full) - cut
            for want, got in zip(full[cut:], rest, strict=True):
                for key in want:
                    if key == "tokens":  # variable-length documents: compare each
                        assert [t.tolist() for t in want[key]] == [t.tolist() for t in got[key]]
                    else:
                        np.testing.assert_array_equal(want[key], got[key], err_msg=key)


def test_a_resume_with_another_schedule_is_refused(sources: list[str], tmp_path: Path) -> None:
    state = _dataset(sources, tmp_path / "c", 1, 0).state_dict()
    other = MixtureSchedule([Phase(until=7, weights=(1.0, 0.0)), Phase(weights=(1.0, 3.0))])
    for schedule in (other, None):
        ds = _dataset(sources, tmp_path / "c", 1, 0, schedule=schedule)
        with pytest.raises(ResumeError, match="schedule"):
            ds.load_state_dict(state)


def test_a_schedule_that_does_not_fit_the_sources_is_one_clear_error(
    sources: list[str], tmp_path: Path
) -> None:
    bad = MixtureSchedule([Phase(weights=(1.0, 1.0, 1.0))])
    with pytest.raises(ConfigError, match="3 weights per phase but there are 2 sources"):
        _dataset(sources, tmp_path / "c", 1, 0, schedule=bad)


def test_the_server_audit_recomputes_a_scheduled_run(
    live_server: LiveServer, tmp_path: Path
) -> None:
    """A run under a schedule (epoch_size 96 of 2 x 64 documents: 24 steps of 4 an epoch)
    commits 30 steps across an epoch end; the server's audit recomputes the scheduled
    plan's epochs from the committed plan and proves the history."""
    with APIClient(live_server.url, live_server.token) as api:
        for name in ("tok-a", "tok-b"):
            write_tokens(tmp_path / name, 64, size_limit=600)
            register_index(api, str(tmp_path / name / "index.json"), name)
        run = api.create_run([("tok-a", 1), ("tok-b", 1)], global_batch_size=4).id
    schedule = MixtureSchedule([Phase(until=10, weights=(3, 1)), Phase(weights=(1, 3))])
    ds = StreamingDataset(
        ["tok-a", "tok-b"],
        4,
        plan=PlanOptions(epoch_size=96, schedule=schedule),
        server=ServerOptions(url=live_server.url, token=live_server.token, run=run),
        cache=CacheOptions(dir=tmp_path / "cache"),
    )
    loader = ShardstreamLoader(ds, num_workers=0)
    it = iter(loader)
    for step in range(1, 31):
        if next(it, None) is None:  # the epoch ended: the next pass is the next epoch
            it = iter(loader)
            next(it)
        loader.commit(step)
    loader.flush_commits()
    loader.close()
    with APIClient(live_server.url, live_server.token) as api:
        report = api.audit_run(run)
    assert report["ok"], report["failures"]
