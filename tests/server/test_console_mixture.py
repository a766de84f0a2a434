"""The run page's mixture schedule: phases, the weights in force and each source's samples
so far, recomputed with the plan's own arithmetic from the latest checkpoint's plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.plan import MixtureSchedule, Phase, PlanConfig, ScheduledPlan, SourceSpec
from shardstream.server.console.mixture import mixture_view
from tests.fixtures.console import sign_in
from tests.server.conftest import ADMIN, make_published

SCHEDULE = MixtureSchedule(
    [Phase(until=10, weights=(3, 1)), Phase(until=16, weights=(3, 1), end_weights=(1, 3), steps=2),
     Phase(weights=(1, 3))]
)  # fmt: skip


def _params(epoch_size: int) -> dict[str, object]:
    plan = {"global_batch_size": 4, "tail": "drop", "epoch_size": epoch_size}
    return {"plan": {**plan, "schedule": SCHEDULE.to_params()}, "world_size": 1}


def test_whole_segments_count_exactly_what_the_plan_reads() -> None:
    sources = [SourceSpec(shard_sizes=np.full(5, 20)), SourceSpec(shard_sizes=np.full(5, 20))]
    config = PlanConfig(global_batch_size=4, epoch_size=80)  # 20 steps an epoch
    plans = [ScheduledPlan(sources, config, e, SCHEDULE) for e in (0, 1)]
    # The segment boundaries: steps 10, 13 and 16 of epoch 0, and the epochs' ends.
    for epoch, batch in [(0, 0), (0, 10), (0, 13), (0, 16), (0, 20), (1, 0), (1, 20)]:
        view = mixture_view(_params(80), ["web", "code"], 80, epoch, 4 * batch)
        assert view is not None and view.step == 20 * epoch + batch
        ids = np.concatenate(
            [plans[e].global_batches(0, 20 if e < epoch else batch) for e in range(epoch + 1)]
        )
        code = int((ids >= 100).sum())  # source 1's ids follow source 0's 100
        assert [s.samples for s in view.sources] == [len(ids) - code, code]


def test_unreadable_or_absent_schedules_leave_the_section_out() -> None:
    assert mixture_view({"plan": {"global_batch_size": 4}}, ["a"], 80, 0, 0) is None
    for bad in ([{"weights": [1]}], [{"weights": "x"}], "nope", [{"weights": [1, 1], "x": 1}]):
        plan = {"plan": {"global_batch_size": 4, "schedule": bad}}
        assert mixture_view(plan, ["a", "b"], 80, 0, 0) is None
    assert mixture_view(_params(80), ["a", "b"], 80, 10**9, 0) is None  # absurd epoch
    assert mixture_view(_params(80), ["a", "b"], None, 0, 0) is None  # unknown epoch size


def test_run_page_shows_the_schedule_and_shares(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    for name in ("web", "code"):
        make_published(api, name, tmp_path / name, shards=2)
    sources = [{"dataset": "web", "version": 1}, {"dataset": "code", "version": 1}]
    run = api.post("/v1/runs", json={"sources": sources, "global_batch_size": 4}).json()
    body = {"step": 18, "epoch": 0, "sample_in_epoch": 72, "plan": _params(80)}
    assert api.post(f"/v1/runs/{run['id']}/checkpoints", json=body).status_code == 201
    page = sign_in(app, ADMIN).get(f"/ui/runs/{run['id']}").text
    assert "Mixture schedule" in page
    assert "steps 0-10: 3:1; steps 10-16: 3:1 -&gt; 1:3; steps 16-: 1:3" in page
    # 40 samples at 3:1 (30 + 10), 12 at 2.5:1.5 (8 + 4), 12 at 1.5:2.5 (5 + 7), then 2
    # of the 4 steps at 1:3 (half of 4 + 12): 45 + 27 of 72.
    assert '<td>web v1</td><td class="num">25.0%</td><td class="num">45</td>' in page
    assert '<td>code v1</td><td class="num">75.0%</td><td class="num">27</td>' in page
    assert "62.5%" in page and "37.5%" in page


def test_phases_that_end_by_tokens_are_named_in_tokens_with_their_steps() -> None:
    """A schedule in tokens counts exactly as the schedule in steps it becomes, and the
    phase list names each end as "<tokens> tokens (step <n>)"."""
    per_step = 2 * 10**8  # a (large) global step's tokens
    tokens = MixtureSchedule(
        [Phase(until_tokens=2 * 10**9, weights=(3, 1)),
         Phase(until_tokens=32 * 10**8 - 1, weights=(3, 1), end_weights=(1, 3), steps=2),
         Phase(weights=(1, 3))],
        tokens_per_step=per_step,
    )  # fmt: skip
    assert tokens.in_steps() == SCHEDULE  # ends at steps 10 and 16 (ceil)
    plan = {"plan": {**_params(80)["plan"], "schedule": tokens.to_params()}}  # type: ignore[dict-item]
    for epoch, batch in [(0, 0), (0, 13), (0, 18), (1, 5)]:
        view = mixture_view(plan, ["web", "code"], 80, epoch, 4 * batch)
        same = mixture_view(_params(80), ["web", "code"], 80, epoch, 4 * batch)
        assert view is not None and same is not None
        assert view.sources == same.sources and view.step == same.step
    assert view.phases == [
        "until 2.0B tokens (step 10): 3:1",
        "2.0B tokens (step 10) until 3.2B tokens (step 16): 3:1 -> 1:3",
        "from 3.2B tokens (step 16): 1:3",
    ]
    assert view.unit == "tokens consumed" and view.now == "5.0B tokens (step 25)"
    assert same.phases[0] == "steps 0-10: 3:1" and same.now == "step 25"
