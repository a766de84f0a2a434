"""``/metrics`` needs no token, so what it shows without one is public: the server's own
figures, and no run's. Per-run figures go to a scrape with an admin token only.
Every test runs on SQLite and PostgreSQL (the ``api`` fixture, an admin)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.fixtures.console import mint
from tests.fixtures.run_requests import commit_stats, input_report, mixed_run


def _run_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("shardstream_run_")]


def test_run_figures_only_for_an_admin_scrape(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run = mixed_run(api, tmp_path)["id"]
    assert commit_stats(api, run, 10, input_report(0, 2, 3.0, 1.0)).status_code == 201
    reader = mint(api, "reader", ["read"])
    with TestClient(app) as anonymous:
        public = anonymous.get("/metrics")
        assert public.status_code == 200
        assert "shardstream_http_requests_total" in public.text
        assert _run_lines(public.text) == []
        as_reader = anonymous.get("/metrics", headers={"Authorization": f"Bearer {reader}"})
        assert as_reader.status_code == 200 and _run_lines(as_reader.text) == []
        bad = anonymous.get("/metrics", headers={"Authorization": "Bearer ss_no_such_token"})
        assert bad.status_code == 401
    admin_lines = _run_lines(api.get("/metrics").text)
    assert f'shardstream_run_data_wait_seconds_total{{run="{run}"}} 3.0' in admin_lines
