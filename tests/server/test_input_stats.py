"""Input figures sent with checkpoint commits: kept per run and rank, bounded, exported.

Every rank commits the same step with its own figures; the server keeps each rank's
latest window, totals and recent wait shares, names the ranks that never reported, and
exports per-run aggregates (no per-rank series) on ``/metrics``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.api_client import APIClient
from shardstream.cli import main
from shardstream.server.config import Settings
from shardstream.server.data import input_stats as input_stats_data
from shardstream.wire import InputStatsReport
from shardstream.wire._input_stats import (
    COUNTS,
    DEFAULT_RANKS,
    MAX_RANKS,
    MAX_WINDOW_COUNT,
    MAX_WINDOW_S,
)
from tests.fixtures.console import sign_in
from tests.fixtures.query_log import count_queries
from tests.fixtures.run_requests import commit_stats, input_report, mixed_run, publish_ints
from tests.fixtures.server import LiveServer
from tests.server.conftest import ADMIN


def test_each_rank_is_kept_and_a_silent_rank_is_named(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)["id"]
    assert api.get(f"/v1/runs/{run}/input-stats").json()["verdict"] == "unknown"
    assert commit_stats(api, run, 10, input_report(0, 4, 1.0, 9.0)).status_code == 201
    for rank, wait in ((1, 6.0), (2, 0.2)):  # the same step again: a replay, still counted
        assert commit_stats(api, run, 10, input_report(rank, 4, wait, 4.0)).status_code == 200
    got = api.get(f"/v1/runs/{run}/input-stats").json()
    assert [r["rank"] for r in got["ranks"]] == [1, 0, 2]  # slowest first
    assert got["missing"] == [3] and got["missing_count"] == 1
    assert got["world_size"] == 4
    assert got["verdict"] == "io_bound"  # rank 1 waits 60 % of its time
    assert round(got["wait_share"], 4) == round(7.2 / (7.2 + 17.0), 4)
    # The rank's next commit adds to its totals; a retry of it is not counted twice.
    assert commit_stats(api, run, 20, input_report(0, 4, 3.0, 7.0)).status_code == 201
    assert commit_stats(api, run, 20, input_report(0, 4, 3.0, 7.0)).status_code == 200
    rank0 = next(
        r for r in api.get(f"/v1/runs/{run}/input-stats").json()["ranks"] if r["rank"] == 0
    )
    assert rank0["total"]["data_wait_s"] == 4.0 and rank0["total"]["batches"] == 200
    assert rank0["total"]["latency_counts"][0] == 180
    assert rank0["latest"]["data_wait_s"] == 3.0
    assert rank0["history"] == [[10, 0.1], [20, 0.3]]
    assert rank0["step"] == 20


def test_a_commit_without_stats_still_works(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)["id"]
    body = {"step": 1, "epoch": 0, "sample_in_epoch": 256}
    assert api.post(f"/v1/runs/{run}/checkpoints", json=body).status_code == 201
    got = api.get(f"/v1/runs/{run}/input-stats").json()
    assert got["ranks"] == [] and got["world_size"] is None and got["missing_count"] == 0


def test_bad_stats_are_422_naming_the_field_and_nothing_is_stored(
    api: TestClient, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    for bad, field in (
        ({"latency_counts": [1] * 11}, "latency_counts"),
        ({"verdict": "fast"}, "verdict"),
        ({"extra": 1}, "extra"),
        ({"storage_bytes": -1}, "storage_bytes"),
        ({"world_size": 1 << 30}, "world_size"),
    ):
        r = commit_stats(api, run, 5, input_report(0, 4, 1.0, 1.0, **bad))
        assert r.status_code == 422, (bad, r.text)
        assert field in r.json()["detail"], r.text
    assert api.get(f"/v1/runs/{run}/checkpoints").json()["items"] == []
    assert api.get(f"/v1/runs/{run}/input-stats").json()["ranks"] == []


def test_a_commit_with_stats_stays_far_within_the_body_limit(
    api: TestClient, tmp_path: Path, settings: Settings
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    largest = input_report(
        (1 << 20) - 1,
        1 << 20,
        MAX_WINDOW_S,
        MAX_WINDOW_S,
        **{name: MAX_WINDOW_COUNT for name in COUNTS},
        latency_counts=[MAX_WINDOW_COUNT] * 10,
        first_batch_s=MAX_WINDOW_S,
        build_s=MAX_WINDOW_S,
        build_cpu_s=MAX_WINDOW_S,
        ring_occupancy=0.123456,
        workers=4096,
    )
    body = {"step": 1, "epoch": 0, "sample_in_epoch": 256, "stats": largest}
    size = len(json.dumps(body))
    assert size < 2048 < settings.max_body_bytes, size
    assert commit_stats(api, run, 1, largest).status_code == 201


def test_metrics_export_per_run_aggregates_without_ranks(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)["id"]
    commit_stats(api, run, 10, input_report(0, 2, 3.0, 1.0))
    commit_stats(api, run, 10, input_report(1, 2, 1.0, 3.0))
    text = api.get("/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("shardstream_run_")]
    assert f'shardstream_run_data_wait_seconds_total{{run="{run}"}} 4.0' in lines
    assert f'shardstream_run_data_wait_ratio{{run="{run}"}} 0.5' in lines
    assert f'shardstream_run_ranks_reporting{{run="{run}"}} 2.0' in lines
    assert f'shardstream_run_ranks_input_bound{{run="{run}"}} 2.0' in lines
    assert f'shardstream_run_input_verdict{{run="{run}",verdict="io_bound"}} 1.0' in lines
    values = dict(line.rsplit(" ", 1) for line in lines)
    assert float(values[f'shardstream_run_storage_bytes_total{{run="{run}"}}']) == 2 << 20
    assert not [line for line in lines if "rank=" in line]
    # A run that is no longer running leaves the export.
    api.patch(f"/v1/runs/{run}", json={"status": "completed"})
    assert "shardstream_run_data_wait_ratio{" not in api.get("/metrics").text


def test_lists_of_runs_flag_input_bound_runs_with_one_query_per_page(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    first = mixed_run(api, tmp_path)
    body = {k: first[k] for k in ("sources", "seed", "global_batch_size", "plan")}
    runs = [first["id"]] + [api.post("/v1/runs", json=body).json()["id"] for _ in range(3)]
    bound, fine, silent, cpu = runs
    commit_stats(api, bound, 10, input_report(0, 4, 6.0, 4.0))  # 60 % waiting: io_bound
    commit_stats(api, bound, 10, input_report(1, 4, 0.1, 9.9))
    commit_stats(api, fine, 10, input_report(0, 2, 0.1, 9.9))
    commit_stats(api, cpu, 10, input_report(0, 2, 5.0, 5.0, verdict="cpu_bound"))
    commit_stats(api, cpu, 10, input_report(1, 2, 5.0, 5.0, verdict="cpu_bound"))
    with count_queries(app) as log:
        items = api.get("/v1/runs").json()["items"]
    assert log.tables["run_input_stats"] == 1  # one grouped query, not one per run
    got = {r["id"]: r["input"] for r in items}
    assert got[bound] == {
        "verdict": "io_bound",
        "ranks_reporting": 2,
        "ranks_input_bound": 1,
        "world_size": 4,
        "max_wait_share": 0.6,
    }
    assert got[fine]["verdict"] == "not_input_bound" and got[fine]["ranks_input_bound"] == 0
    assert got[silent] == {
        "verdict": "unknown",
        "ranks_reporting": 0,
        "ranks_input_bound": 0,
        "world_size": None,
        "max_wait_share": None,
    }
    assert got[cpu]["verdict"] == "cpu_bound" and got[cpu]["ranks_input_bound"] == 2
    assert api.get(f"/v1/runs/{cpu}").json()["input"] == got[cpu]
    # The console's list: a badge per run, from the same single query.
    client = sign_in(app, ADMIN)
    with count_queries(app) as log:
        page = client.get("/ui/runs").text
    assert log.tables["run_input_stats"] == 1
    cells = {run: page[page.index(f'id="run-{run}"') :].split("</tr>", 1)[0] for run in runs}
    assert ">io bound</span> 1 of 4 ranks" in cells[bound]
    assert ">not input bound</span>" in cells[fine]
    assert "no figures" in cells[silent] and "badge failed" not in cells[silent]
    assert ">cpu bound</span> 2 of 2 ranks" in cells[cpu]


def test_input_stats_of_4096_ranks_are_bounded_by_default_and_page_slowest_first(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    world = 4096
    with app.state.sessionmaker.begin() as session:  # what 4,095 ranks' commits store
        for rank in range(1, world):  # rank 0 never reports
            wait = (rank % 97) / 10
            stats = input_report(
                rank, world, wait, 10.0 - wait, **({"verdict": "cpu_bound"} if rank % 2 else {})
            )
            input_stats_data.record(session, run, 10, InputStatsReport.model_validate(stats))
    r = api.get(f"/v1/runs/{run}/input-stats")
    assert r.status_code == 200
    assert len(r.content) < 64_000, len(r.content)  # every rank: about 5 MB
    got = r.json()
    assert len(got["ranks"]) == DEFAULT_RANKS and got["ranks_reporting"] == world - 1
    assert got["missing"] == [0] and got["missing_count"] == 1 and got["world_size"] == world
    assert got["verdict_counts"] == {"cpu_bound": 2048, "io_bound": 1833, "not_input_bound": 214}
    assert got["verdict"] == "cpu_bound"
    expected_wait = sum((rank % 97) / 10 for rank in range(1, world))
    assert round(got["wait_share"], 6) == round(expected_wait / (10.0 * (world - 1)), 6)
    # The largest page stays under half a megabyte; pages cover every rank once, slowest first.
    seen: list[tuple[float, int]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": MAX_RANKS} | ({"cursor": cursor} if cursor else {})
        page = api.get(f"/v1/runs/{run}/input-stats", params=params)
        assert len(page.content) < 512_000, len(page.content)
        body = page.json()
        seen += [(r["wait_share"], r["rank"]) for r in body["ranks"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [rank for _, rank in seen] == [
        rank for _, rank in sorted(seen, key=lambda x: (-x[0], x[1]))
    ]
    assert sorted(rank for _, rank in seen) == list(range(1, world))
    # Bad paging parameters: one 422 naming the parameter.
    for bad, name in (({"limit": 0}, "limit"), ({"limit": MAX_RANKS + 1}, "limit"),
                      ({"cursor": "x/1"}, "cursor"), ({"cursor": "0.5/-1"}, "cursor"),
                      ({"cursor": "nan/1"}, "cursor")):  # fmt: skip
        r = api.get(f"/v1/runs/{run}/input-stats", params=bad)
        assert r.status_code == 422 and name in r.json()["detail"], (bad, r.text)
    # The run page lists the 16 slowest and says how many reported.
    page_text = sign_in(app, ADMIN).get(f"/ui/runs/{run}").text
    assert page_text.count('id="input-rank-') == 16
    assert "The 16 slowest ranks of 4095" in page_text


def test_runs_show_prints_wait_share_verdict_and_silent_ranks(
    live_server: LiveServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSTREAM_SERVER", live_server.url)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient() as api:
        publish_ints(api, live_server.storage_root, "alpha")
        run = api.create_run([("alpha", 1)], global_batch_size=8, seed=3, name="r1")
        for rank, wait in ((0, 1.0), (2, 8.0)):  # rank 1 of 3 never reports
            stats = input_report(rank, 3, wait, 2.0, verdict="cpu_bound" if rank else "io_bound")
            stats.update(packed_tokens=700 + 300 * rank, truncated_tokens=300 * (rank == 0))
            api.commit_checkpoint(run.id, step=10, epoch=0, sample_in_epoch=80, stats=stats)
    capsys.readouterr()
    assert main(["runs", "list"]) == 0
    listed = capsys.readouterr().out
    assert "INPUT" in listed and "_bound (2/3 ranks)" in listed, listed
    assert main(["runs", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["input"]["ranks_input_bound"] == 2
    assert main(["runs", "show", str(run.id)]) == 0
    shown = capsys.readouterr().out
    assert "input: cpu_bound" in shown or "input: io_bound" in shown, shown
    assert "never reported: rank 1" in shown, shown
    assert "packing: truncated 300 of 2300 document tokens (13.0%) over the 2 ranks" in shown
    table = shown[shown.index("RANK") if "RANK" in shown else shown.index("rank  wait") :]
    first = table.splitlines()[1].split()
    assert first[:3] == ["2", "80.0%", "cpu_bound"], table  # the slowest rank first
    assert main(["runs", "show", str(run.id), "--json"]) == 0
    inputs = json.loads(capsys.readouterr().out)["input_stats"]
    assert inputs["missing"] == [1] and [r["rank"] for r in inputs["ranks"]] == [2, 0]


def test_the_run_page_shows_wait_share_per_rank_verdict_and_silent_ranks(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    client = sign_in(app, ADMIN)
    assert "No rank has sent input figures yet" in client.get(f"/ui/runs/{run}").text
    for step, wait in ((10, 1.0), (20, 5.0)):
        commit_stats(api, run, step, input_report(0, 3, wait, 5.0))
    commit_stats(api, run, 20, input_report(2, 3, 0.1, 9.9, verdict="not_input_bound"))
    page = client.get(f"/ui/runs/{run}").text
    assert ">io bound</span>" in page  # rank 0 waits half its time now
    assert "never reported: rank 1" in page
    assert page.index('id="input-rank-0"') < page.index('id="input-rank-2"')  # slowest first
    row = page[page.index('id="input-rank-0"') :].split("</tr>", 1)[0]
    assert "50.0%" in row and row.count("<polyline") == 1  # its wait share over 2 commits


def test_the_grafana_dashboard_queries_metrics_the_server_exports(
    api: TestClient, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    commit_stats(api, run, 10, input_report(0, 2, 3.0, 1.0))
    exported = {
        line.split("{")[0].split(" ")[0]
        for line in api.get("/metrics").text.splitlines()
        if line and not line.startswith("#")
    }
    exported.add("shardstream_http_requests_total")  # counted from the first request on
    dashboard = Path(__file__).parents[2] / "deploy" / "grafana" / "shardstream-input.json"
    queries = [
        target["expr"]
        for panel in json.loads(dashboard.read_text())["panels"]
        for target in panel["targets"]
    ]
    used = {name for q in queries for name in re.findall(r"shardstream_\w+", q)}
    assert used and used <= exported, used - exported


def test_figures_past_one_windows_bounds_are_422_naming_the_field(
    api: TestClient, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    for bad, field in (
        ({"data_wait_s": 9e11}, "data_wait_s"),
        ({"first_batch_s": 2e9}, "first_batch_s"),
        ({"storage_bytes": 2**62}, "storage_bytes"),
        ({"batches": 2**62}, "batches"),
        ({"truncated_tokens": 2**60}, "truncated_tokens"),
        ({"latency_counts": [2**60] + [0] * 9}, "latency_counts"),
    ):
        r = commit_stats(api, run, 5, input_report(0, 4, 1.0, 1.0, **bad))
        assert r.status_code == 422, (bad, r.text)
        assert field in r.json()["detail"] and "window" in r.json()["detail"], r.text
    assert api.get(f"/v1/runs/{run}/input-stats").json()["ranks"] == []


def test_totals_saturate_and_every_view_still_answers(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """Commits of the largest windows, many times over: the totals stop at their bounds
    and the run's views (input figures, mixture, runs list, metrics) answer 200."""
    run = mixed_run(api, tmp_path)["id"]
    big = 2**53
    window = input_report(
        0, 1, 1e9, 1e9, batches=big, storage_bytes=big, latency_counts=[big] * 10,
    )  # fmt: skip
    for step in (1, 2):
        assert commit_stats(api, run, step, window).status_code == 201
    # 1,100 windows of 1e9 s and 2**53 (past both bounds), stored as the commits would.
    with app.state.sessionmaker.begin() as session:
        for step in range(3, 1100):
            input_stats_data.record(session, run, step, InputStatsReport.model_validate(window))
    assert commit_stats(api, run, 1100, window).status_code == 201
    got = api.get(f"/v1/runs/{run}/input-stats")
    assert got.status_code == 200, got.text
    total = got.json()["ranks"][0]["total"]
    assert total["data_wait_s"] == 1e12 and total["step_s"] == 1e12
    assert total["batches"] == 2**62 and total["storage_bytes"] == 2**62
    assert total["latency_counts"] == [2**62] * 10
    assert got.json()["wait_share"] == 0.5
    for path in (f"/v1/runs/{run}/mixture", f"/v1/runs/{run}", "/v1/runs", "/metrics"):
        assert api.get(path).status_code == 200, path


def test_rows_summed_before_totals_saturated_are_read_within_bounds(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """What an earlier server stored (sums past the bounds) is shown held to them."""
    run = mixed_run(api, tmp_path)["id"]
    assert commit_stats(api, run, 1, input_report(0, 1, 1.0, 1.0)).status_code == 201
    from shardstream.server.models import RankInputStatsRow

    with app.state.sessionmaker.begin() as session:
        row = session.get(RankInputStatsRow, (run, 0))
        assert row is not None
        row.total = {**row.total, "data_wait_s": 1.8e12, "storage_bytes": 2**63 - 1}
    got = api.get(f"/v1/runs/{run}/input-stats")
    assert got.status_code == 200, got.text
    total = got.json()["ranks"][0]["total"]
    assert total["data_wait_s"] == 1e12 and total["storage_bytes"] == 2**62
