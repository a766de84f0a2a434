"""What the console tells a person: a sign-in error says what to do in a browser, and
an epoch's progress counts the samples that are trained (a dropped tail never is).
Every test runs on SQLite and PostgreSQL (the ``api`` fixture)."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.fixtures.console import browser, mint, sign_in
from tests.server.conftest import make_published


def test_an_unknown_token_is_explained_for_a_browser_user(api: TestClient, app: FastAPI) -> None:
    with browser(app) as client:
        page = client.post("/ui/login", data={"token": "ss_not_a_token_at_all"})
    assert page.status_code == 401
    error = re.search(r'id="sign-in-error">([^<]*)<', page.text)
    assert error is not None, page.text
    assert "SHARDSTREAM_TOKEN" not in error.group(1)  # set in no browser
    assert "paste the whole token" in error.group(1)


def test_an_epoch_read_to_its_dropped_tail_shows_100_percent(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    """9 samples in global batches of 4: two batches (8 samples) are trained, the ninth
    is dropped; a checkpoint after both batches is the whole epoch."""
    make_published(api, "corpus", tmp_path / "corpus", shards=3)  # 3 shards of 3
    body = {"sources": [{"dataset": "corpus", "version": 1}], "global_batch_size": 4}
    run = api.post("/v1/runs", json=body).json()["id"]
    checkpoint = {"step": 2, "epoch": 0, "sample_in_epoch": 8, "plan": {}}
    assert api.post(f"/v1/runs/{run}/checkpoints", json=checkpoint).status_code == 201
    client = sign_in(app, mint(api, "viewer", ["read"]))
    listing = client.get("/ui/runs").text
    assert "100.0%" in listing and "88.9%" not in listing
    page = client.get(f"/ui/runs/{run}").text
    assert "100.0% (8 of 8 trained samples)" in page, page
