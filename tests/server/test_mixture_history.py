"""A run's mixture over training: per window of global steps, each source's samples (and
tokens where known) beside the schedule's planned weights; kept bounded per run whatever a
client commits, shown on the run page as an SVG and in ``GET /v1/runs/{id}/mixture``."""

from __future__ import annotations

import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from shardstream.plan import MixtureSchedule, Phase, PlanConfig, ScheduledPlan, SourceSpec
from shardstream.server.console.headers import POLICY
from shardstream.server.data.mixture_history import MixturePlan
from shardstream.server.models import RunMixtureRow
from shardstream.wire import (
    MAX_EPOCHS,
    MAX_MIXTURE_WINDOWS,
    RunMixtureHistory,
    phase_end_text,
    token_count_text,
)
from tests.fixtures.console import sign_in
from tests.fixtures.server import LiveServer
from tests.server.conftest import ADMIN, shard

# 3:1 until step 10, then 1:3: a phase change the curve must show where it happens.
SCHEDULE = MixtureSchedule([Phase(until=10, weights=(3, 1)), Phase(weights=(1, 3))])


def _plan(schedule: Any = None, *, batch: int = 4, epoch_size: int = 80) -> dict[str, Any]:
    params = {"global_batch_size": batch, "tail": "drop", "epoch_size": epoch_size}
    if schedule is not None:
        params["schedule"] = schedule
    return {"plan": params, "world_size": 1}


def _publish(api: TestClient, name: str, root: Path, columns: dict[str, str]) -> None:
    assert api.post("/v1/datasets", json={"name": name}).status_code == 201
    body = {"columns": columns, "storage_root": root.as_uri()}
    assert api.post(f"/v1/datasets/{name}/versions", json=body).status_code == 201
    root.mkdir(parents=True)
    (root / "shard.00000.mds").write_bytes(b"x" * 10)
    shards = {"shards": [shard(0)]}
    assert api.post(f"/v1/datasets/{name}/versions/1/shards", json=shards).status_code == 200
    assert api.post(f"/v1/datasets/{name}/versions/1/publish").status_code == 200


def _run(api: TestClient, tmp_path: Path, columns: list[dict[str, str]] | None = None) -> int:
    names = ["web", "code", "math", "books"][: len(columns or [{}, {}])]
    for name, cols in zip(names, columns or [{"tokens": "ndarray:uint16:8"}] * 2, strict=True):
        _publish(api, name, tmp_path / name, cols)
    sources = [{"dataset": n, "version": 1} for n in names]
    run = api.post("/v1/runs", json={"sources": sources, "global_batch_size": 4})
    assert run.status_code == 201, run.text
    return int(run.json()["id"])


def _commit(api: TestClient, run: int, step: int, epoch: int, sample: int, plan: Any) -> None:
    body = {"step": step, "epoch": epoch, "sample_in_epoch": sample, "plan": plan}
    answer = api.post(f"/v1/runs/{run}/checkpoints", json=body)
    assert answer.status_code in (200, 201), answer.text


# -- the arithmetic ------------------------------------------------------------------------


def test_windows_count_what_the_plan_reads_and_add_up() -> None:
    schedule = MixtureSchedule(
        [Phase(until=10, weights=(3, 1)), Phase(until=16, weights=(3, 1), end_weights=(1, 3),
         steps=2), Phase(weights=(1, 3))]
    )  # fmt: skip
    arithmetic = MixturePlan.of(_plan(schedule.to_params()), 2, 80)
    assert arithmetic is not None and arithmetic.num_batches == 20
    sources = [SourceSpec(shard_sizes=np.full(5, 20)), SourceSpec(shard_sizes=np.full(5, 20))]
    config = PlanConfig(global_batch_size=4, epoch_size=80)
    plans = [ScheduledPlan(sources, config, e, schedule) for e in range(3)]
    # Windows whose edges are segment boundaries count exactly what the plan reads.
    for lo, hi in [(0, 10), (10, 13), (13, 16), (16, 20), (20, 40), (10, 60), (0, 60)]:
        ids = np.concatenate(
            [
                plans[e].global_batches(max(lo, 20 * e) - 20 * e, min(hi, 20 * (e + 1)) - 20 * e)
                for e in range(lo // 20, -(-hi // 20))
            ]
        )
        code = int((ids >= 100).sum())
        assert arithmetic.counts(lo, hi) == [len(ids) - code, code], (lo, hi)
    assert arithmetic.planned(0, 10) == [0.75, 0.25]
    assert arithmetic.planned(16, 20) == [0.25, 0.75]
    assert arithmetic.planned(8, 12) == [0.6875, 0.3125]  # half of it 3:1, half 2.5:1.5
    # A billion epochs: counted per schedule piece, not per epoch.
    started = time.perf_counter()
    far = arithmetic.counts(0, 20 * 10**9)
    assert time.perf_counter() - started < 0.5
    assert sum(far) == 80 * 10**9


# -- the API ---------------------------------------------------------------------------------


def test_the_curve_follows_the_phase_change_in_samples_and_tokens(
    api: TestClient, tmp_path: Path
) -> None:
    run = _run(api, tmp_path, [{"tokens": "ndarray:uint16:8"}, {"tokens": "ndarray:uint16:2"}])
    plan = _plan(SCHEDULE.to_params())
    for step in range(1, 19):  # one commit per step, through the phase change at step 10
        _commit(api, run, step, 0, 4 * step, plan)
    answer = api.get(f"/v1/runs/{run}/mixture")
    assert answer.status_code == 200, answer.text
    history = answer.json()
    assert history["scheduled"] and history["step"] == 18 and history["phase_ends"] == [10]
    assert history["sources"] == ["web v1", "code v1"]
    assert history["tokens_per_sample"] == [8, 2]
    windows = history["windows"]
    assert windows[0]["start"] == 0 and windows[-1]["stop"] == 18
    assert all(a["stop"] == b["start"] for a, b in itertools.pairwise(windows))
    for w in windows:
        assert sum(w["samples"]) == 4 * (w["stop"] - w["start"])
        assert w["tokens"] == [w["samples"][0] * 8, w["samples"][1] * 2]
        if w["stop"] <= 10:
            assert w["planned"] == [0.75, 0.25] and w["samples"][0] == 3 * w["samples"][1]
        elif w["start"] >= 10:
            assert w["planned"] == [0.25, 0.75] and 3 * w["samples"][0] == w["samples"][1]
    # The samples of all windows are the run's so far: 40 at 3:1, then 32 at 1:3.
    assert [sum(w["samples"][s] for w in windows) for s in (0, 1)] == [30 + 8, 10 + 24]


def test_odd_runs_answer_without_windows_and_never_fail(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    assert api.get("/v1/runs/999999/mixture").status_code == 404
    run = _run(api, tmp_path)
    empty = api.get(f"/v1/runs/{run}/mixture").json()  # no commit, no schedule
    assert empty["scheduled"] is False and empty["windows"] == [] and empty["step"] is None
    page = sign_in(app, ADMIN).get(f"/ui/runs/{run}")
    assert page.status_code == 200 and "mixture-chart" not in page.text
    _commit(api, run, 1, 0, 4, _plan())  # a plan without a schedule
    assert api.get(f"/v1/runs/{run}/mixture").json()["windows"] == []
    for step, bad in enumerate(
        [
            [{"weights": [1]}],  # one weight for two sources
            [{"weights": "x"}],
            [{"weights": [1, 1], "until": 10**12, "end_weights": [0, 1], "steps": 0}],
            "nope",
        ],
        start=2,
    ):
        _commit(api, run, step, 0, 4 * step, _plan(bad))
        answer = api.get(f"/v1/runs/{run}/mixture")
        assert answer.status_code == 200 and answer.json()["scheduled"] is False
        assert sign_in(app, ADMIN).get(f"/ui/runs/{run}").status_code == 200
    with app.state.sessionmaker() as session:
        assert session.scalars(select(RunMixtureRow)).all() == []
    # One source, documents of varying length: shares of samples, no tokens.
    single = api.post(
        "/v1/runs", json={"sources": [{"dataset": "web", "version": 1}], "global_batch_size": 4}
    ).json()["id"]
    one = MixtureSchedule([Phase(weights=(1,))]).to_params()
    _commit(api, single, 1, 0, 8, _plan(one))
    history = api.get(f"/v1/runs/{single}/mixture").json()
    assert [w["samples"] for w in history["windows"]] == [[4], [4]]
    assert sign_in(app, ADMIN).get(f"/ui/runs/{single}").status_code == 200


def test_a_hostile_client_cannot_grow_the_history_past_the_cap(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = _run(api, tmp_path, [{"tokens": "ndarray:uint16:8"}] * 4)
    schedule = MixtureSchedule(
        [Phase(until=100, weights=(1, 1, 1, 1)), Phase(weights=(1, 0, 0, 3))]
    ).to_params()
    plan = _plan(schedule, epoch_size=8)  # 2 steps an epoch: positions grow fast
    sizes = []
    # Positions forward by 1, by huge jumps, back (a position behind the last) and forward.
    # (The furthest a commit may go is epoch MAX_EPOCHS: beyond, it is refused at the door.)
    epochs = [*range(0, 300, 3), 10**5, 10**5 + 1, 5, 7, 5 * 10**5, MAX_EPOCHS - 1, MAX_EPOCHS]
    for step, epoch in enumerate(epochs, start=1):
        _commit(api, run, step, epoch, 4, plan)
        with app.state.sessionmaker() as session:
            row = session.get(RunMixtureRow, run)
            assert row is not None
            assert len(row.windows) <= MAX_MIXTURE_WINDOWS
            sizes.append(len(json.dumps(row.windows)))
        history = api.get(f"/v1/runs/{run}/mixture").json()
        windows = history["windows"]
        assert len(windows) <= MAX_MIXTURE_WINDOWS + 1  # the finished ones and the open one
        assert windows[-1]["stop"] == history["step"] == 2 * epoch + 1
        assert sum(sum(w["samples"]) for w in windows) == 4 * history["step"]
    # The row stays a few kilobytes however far and however often the client commits.
    assert max(sizes) < 64 * 1024
    page = sign_in(app, ADMIN).get(f"/ui/runs/{run}")
    assert page.status_code == 200 and page.text.count('class="window"') <= 65


def test_the_run_page_draws_the_planned_phase_change(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = _run(api, tmp_path)
    plan = _plan(SCHEDULE.to_params())
    for step in range(1, 19):
        _commit(api, run, step, 0, 4 * step, plan)
    page = sign_in(app, ADMIN).get(f"/ui/runs/{run}")
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == POLICY  # no script, nothing fetched
    text = page.text
    assert '<div id="mixture-chart"><svg' in text and "<script" not in text
    assert "a phase ends at step 10" in text
    # Before the change web has 3 of 4 samples, after it 1 of 4, as planned.
    assert "steps 0-1: web v1: 75.0% of samples, 75.0% of tokens (planned 75.0%)" in text
    assert "steps 17-18: web v1: 25.0% of samples, 25.0% of tokens (planned 25.0%)" in text
    assert '<tr id="mixture-legend-0">' in text and "code v1" in text


def test_a_schedule_in_tokens_is_shown_in_tokens_with_its_steps(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """Phases that end by tokens: the API gives the tokens beside the steps they become,
    and the page names every phase end as "<tokens> tokens (step <n>)"."""
    run = _run(api, tmp_path, [{"tokens": "ndarray:uint16:2048"}] * 2)
    per_step = 4 * 2048  # a global batch of 4 rows of 2048 tokens
    tokens = MixtureSchedule(
        [Phase(until_tokens=10 * per_step - 100, weights=(3, 1)), Phase(weights=(1, 3))],
        tokens_per_step=per_step,
    )
    assert tokens.step_ends() == (10, None)  # ceil: the phase ends where the step one did
    plan = _plan(tokens.to_params())
    for step in range(1, 19):
        _commit(api, run, step, 0, 4 * step, plan)
    history = api.get(f"/v1/runs/{run}/mixture").json()
    assert history["phase_ends"] == [10] and history["phase_end_tokens"] == [81_820]
    assert history["tokens_per_step"] == per_step
    # The same windows as the schedule in steps it is (the curve of the test above).
    windows = history["windows"]
    assert [w["samples"] for w in windows] == [[3, 1]] * 10 + [[1, 3]] * 8
    assert windows[0]["tokens"] == [3 * 2048, 2048]
    text = sign_in(app, ADMIN).get(f"/ui/runs/{run}").text
    assert "a phase ends at 81.82K tokens (step 10)" in text
    assert "until 81.82K tokens (step 10): 3:1; from 81.82K tokens (step 10): 1:3" in text
    assert "by tokens consumed; now at 147.456K tokens (step 18)" in text
    assert "147.456K tokens (step 18)</text>" in text  # the chart's last tick
    # A schedule in steps keeps its steps, and gives no tokens.
    sources = [{"dataset": n, "version": 1} for n in ("web", "code")]
    other = api.post("/v1/runs", json={"sources": sources, "global_batch_size": 4}).json()["id"]
    _commit(api, other, 1, 0, 4, _plan(SCHEDULE.to_params()))
    in_steps = api.get(f"/v1/runs/{other}/mixture").json()
    assert in_steps["tokens_per_step"] is None and in_steps["phase_end_tokens"] == []
    assert "now at step 1)" in sign_in(app, ADMIN).get(f"/ui/runs/{other}").text


def test_ranks_committing_together_through_a_live_server_count_each_step_once(
    live: LiveServer,
) -> None:
    """Real uvicorn on this backend: four ranks commit every step (replays of one another)
    in parallel through the phase change; each window holds its step's samples once."""
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=30) as client:
        run = _run(client, live.storage_root)  # type: ignore[arg-type]
        plan = _plan(SCHEDULE.to_params())

        def rank(_: int) -> None:
            with httpx.Client(base_url=live.url, headers=live.headers, timeout=30) as mine:
                for step in range(1, 15):
                    _commit(mine, run, step, 0, 4 * step, plan)  # type: ignore[arg-type]

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(rank, range(4)))
        history = client.get(f"/v1/runs/{run}/mixture").json()
        windows = history["windows"]
        assert history["step"] == 14 and [w["start"] for w in windows] == list(range(14))
        assert [w["samples"] for w in windows] == [[3, 1]] * 10 + [[1, 3]] * 4
        assert [w["tokens"] for w in windows] == [[24, 8]] * 10 + [[8, 24]] * 4
        page = client.get("/ui/login")  # the console is served by the same process
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == POLICY


def test_phase_ends_are_worded_in_steps_or_in_tokens_with_their_step() -> None:
    assert [token_count_text(n) for n in (0, 950, 1000, 12_500, 2 * 10**9, 1_234_567_891)] == [
        "0", "950", "1.0K", "12.5K", "2.0B", "1.235B"
    ]  # fmt: skip
    assert token_count_text(1_250_000_000_000) == "1.25T"
    assert phase_end_text(10) == "step 10"
    assert phase_end_text(123, 2 * 10**9) == "2.0B tokens (step 123)"
    history = RunMixtureHistory(
        run_id=1, sources=["a"], scheduled=True, tokens_per_sample=[None], phase_ends=[10, 1234]
    )
    assert history.phase_end_labels() == ["step 10", "step 1,234"]
    tokens = history.model_copy(update={"phase_end_tokens": [10**6, 2 * 10**6]})
    assert tokens.phase_end_labels() == ["1.0M tokens (step 10)", "2.0M tokens (step 1,234)"]


def test_windows_add_up_to_the_steps_read_on_cut_segments_and_tails() -> None:
    """Issue 35: each window is a difference of cumulative counts, so 1-step windows of a
    batch of 16 hold 16 samples (not 15 each: 900 of 960 over 60 steps), the run's share
    stays the schedule's, and an epoch's dropped tail is never counted."""
    schedule = MixtureSchedule([Phase(until=7, weights=(0.725, 0.275)), Phase(weights=(1, 3))])
    arithmetic = MixturePlan.of(_plan(schedule.to_params(), batch=16, epoch_size=165), 2, 165)
    assert arithmetic is not None and arithmetic.num_batches == 10  # 5 samples dropped
    windows = [arithmetic.counts(step, step + 1) for step in range(60)]
    assert all(sum(w) == 16 and min(w) >= 0 for w in windows), windows
    assert [sum(col) for col in zip(*windows, strict=True)] == arithmetic.counts(0, 60)
    assert sum(arithmetic.counts(0, 60)) == 960
    # The first phase's 7 steps: 72.5 % of 112 samples, within one sample.
    first = [sum(w[0] for w in windows[:7]), sum(w[1] for w in windows[:7])]
    assert sum(first) == 112 and abs(first[0] - 0.725 * 112) <= 1
    # Any cut of the run adds up, in steps of the global batch.
    for lo, hi in [(0, 10), (3, 17), (9, 11), (10, 20), (5, 59), (0, 10**6)]:
        assert sum(arithmetic.counts(lo, hi)) == 16 * (hi - lo)
    assert arithmetic.cumulative(10) == arithmetic.counts(0, 10)


def test_a_padded_tail_counts_the_samples_read_again() -> None:
    schedule = MixtureSchedule([Phase(until=3, weights=(1, 1)), Phase(weights=(1, 3))])
    params = {"global_batch_size": 4, "tail": "pad", "epoch_size": 18, "schedule": None}
    params["schedule"] = schedule.to_params()
    arithmetic = MixturePlan.of({"plan": params}, 2, 18)
    assert arithmetic is not None and arithmetic.num_batches == 5  # 2 samples padded
    windows = [arithmetic.counts(s, s + 1) for s in range(15)]
    assert all(sum(w) == 4 and min(w) >= 0 for w in windows)
