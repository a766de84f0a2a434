"""Every rank of a job may commit the same step at once: all get 200/201, never a 409."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import httpx
from fastapi.testclient import TestClient

from tests.fixtures.server import LiveServer
from tests.server.conftest import make_published


def test_ranks_committing_the_same_step_concurrently_all_succeed(
    live: LiveServer, tmp_path: Path
) -> None:
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=30) as api:
        make_published(cast(TestClient, api), "a", tmp_path / "a")
        run = api.post(
            "/v1/runs", json={"sources": [{"dataset": "a", "version": 1}], "global_batch_size": 8}
        ).json()

        def commit(step: int) -> int:
            state: dict[str, Any] = {"step": step, "epoch": 0, "sample_in_epoch": step * 8}
            state["plan"] = {"batch": step}
            return api.post(f"/v1/runs/{run['id']}/checkpoints", json=state).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = [c for step in range(1, 11) for c in pool.map(commit, [step] * 8)]
        assert set(codes) <= {200, 201}, codes
        assert codes.count(201) == 10  # one creation per step, the rest "unchanged"
        steps = api.get(f"/v1/runs/{run['id']}/checkpoints").json()["items"]
        assert [c["step"] for c in steps] == list(range(1, 11))
