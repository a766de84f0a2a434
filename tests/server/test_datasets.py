"""Datasets: create, list (paginated), get, delete (refused while a run reads it)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.server.conftest import make_published


def test_create_get_and_duplicate(api: TestClient) -> None:
    # The owner is the calling token, set by the server; a caller-chosen one is refused.
    claimed = api.post("/v1/datasets", json={"name": "wiki", "owner": "someone-else"})
    assert claimed.status_code == 422
    assert claimed.json()["detail"].startswith("body.owner")
    created = api.post("/v1/datasets", json={"name": "wiki", "description": "d"})
    assert created.status_code == 201
    assert created.json()["name"] == "wiki"
    got = api.get("/v1/datasets/wiki").json()
    owner = "admin (SHARDSTREAM_ADMIN_TOKEN)"
    assert (got["description"], got["owner"], got["num_versions"]) == ("d", owner, 0)
    again = api.post("/v1/datasets", json={"name": "wiki"})
    assert again.status_code == 409
    assert "wiki" in again.json()["detail"]


def test_invalid_names_are_422_naming_the_field(api: TestClient) -> None:
    for bad in ["Wiki", "-x", "", "a" * 129, "a/b", "a b", "ü"]:
        r = api.post("/v1/datasets", json={"name": bad})
        assert r.status_code == 422, bad
        assert r.json()["detail"].startswith("body.name"), r.json()
    r = api.post("/v1/datasets", json={"name": "ok", "extra": 1})
    assert r.status_code == 422
    assert "body.extra" in r.json()["detail"]
    assert api.get("/v1/datasets/UPPER").status_code == 422


def test_list_is_keyset_paginated(api: TestClient) -> None:
    names = [f"ds-{i:02d}" for i in range(7)]
    for name in reversed(names):
        assert api.post("/v1/datasets", json={"name": name}).status_code == 201
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = api.get("/v1/datasets", params=params).json()
        seen += [d["name"] for d in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names
    assert pages == 3
    assert api.get("/v1/datasets", params={"limit": 0}).status_code == 422
    assert api.get("/v1/datasets", params={"cursor": "NOT A NAME"}).status_code == 422


def test_missing_dataset_is_404(api: TestClient) -> None:
    r = api.get("/v1/datasets/nope")
    assert r.status_code == 404
    assert "nope" in r.json()["detail"]
    assert api.delete("/v1/datasets/nope").status_code == 404


def test_delete_refused_while_running_run_reads_it(api: TestClient, tmp_path: Path) -> None:
    make_published(api, "wiki", tmp_path / "v1")
    run = api.post(
        "/v1/runs", json={"sources": [{"dataset": "wiki", "version": 1}], "global_batch_size": 8}
    ).json()
    refused = api.delete("/v1/datasets/wiki")
    assert refused.status_code == 409
    assert str(run["id"]) in refused.json()["detail"]
    assert "force" in refused.json()["detail"]
    # a finished run no longer protects the dataset
    api.patch(f"/v1/runs/{run['id']}", json={"status": "completed"})
    make_published(api, "other", tmp_path / "o1")
    run2 = api.post(
        "/v1/runs", json={"sources": [{"dataset": "other", "version": 1}], "global_batch_size": 8}
    ).json()
    assert api.delete("/v1/datasets/wiki").status_code == 204
    assert api.get("/v1/datasets/wiki").status_code == 404
    # force deletes even while a run reads it; the run keeps the names it read
    assert api.delete("/v1/datasets/other").status_code == 409
    assert api.delete("/v1/datasets/other", params={"force": "true"}).status_code == 204
    kept = api.get(f"/v1/runs/{run2['id']}").json()
    assert kept["sources"] == [{"dataset": "other", "version": 1, "weight": 1.0}]
    # the name can be reused, starting again at version 1
    assert make_published(api, "wiki", tmp_path / "v1b")["number"] == 1


def test_counts_in_public_view(api: TestClient, tmp_path: Path) -> None:
    make_published(api, "wiki", tmp_path / "a")
    api.post("/v1/datasets/wiki/versions", json={"columns": {"x": "int"}})
    got = api.get("/v1/datasets/wiki").json()
    assert (got["num_versions"], got["latest_published"]) == (2, 1)
