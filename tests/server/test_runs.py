"""Runs and checkpoints: monotonic, idempotent commits; 409 on conflicting state."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.fixtures.run_requests import mixed_run
from tests.server.conftest import make_published


def test_create_get_list_and_status(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)
    assert run["status"] == "running"
    assert [s["weight"] for s in run["sources"]] == [0.7, 0.3]
    got = api.get(f"/v1/runs/{run['id']}").json()
    assert got == run
    listed = api.get("/v1/runs").json()
    assert [r["id"] for r in listed["items"]] == [run["id"]]
    done = api.patch(f"/v1/runs/{run['id']}", json={"status": "completed"}).json()
    assert done["status"] == "completed"
    assert api.patch(f"/v1/runs/{run['id']}", json={"status": "weird"}).status_code == 422
    assert api.get("/v1/runs/999").status_code == 404


def test_runs_read_only_published_versions(api: TestClient, tmp_path: Path) -> None:
    make_published(api, "a", tmp_path / "a")
    api.post("/v1/datasets/a/versions", json={"columns": {}})
    body = {"sources": [{"dataset": "a", "version": 2}], "global_batch_size": 4}
    draft = api.post("/v1/runs", json=body)
    assert draft.status_code == 409
    assert "published" in draft.json()["detail"]
    body["sources"] = [{"dataset": "a", "version": 9}]
    assert api.post("/v1/runs", json=body).status_code == 404
    bad = {"sources": [{"dataset": "a", "version": 1, "weight": -1}], "global_batch_size": 4}
    r = api.post("/v1/runs", json=bad)
    assert r.status_code == 422
    assert "body.sources[0].weight" in r.json()["detail"]
    assert api.post("/v1/runs", json={"sources": [], "global_batch_size": 4}).status_code == 422


def test_checkpoint_semantics(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)
    url = f"/v1/runs/{run['id']}/checkpoints"
    assert api.get(f"{url}/latest").status_code == 404
    state = {"step": 100, "epoch": 0, "sample_in_epoch": 25_600, "plan": {"num_partitions": 8}}
    first = api.post(url, json=state)
    assert first.status_code == 201
    assert first.json()["step"] == 100
    same = api.post(url, json=state)
    assert same.status_code == 200  # idempotent re-commit
    assert same.json() == first.json()
    changed = api.post(url, json={**state, "sample_in_epoch": 1})
    assert changed.status_code == 409
    assert "step 100" in changed.json()["detail"]
    assert api.post(url, json={**state, "step": 200, "sample_in_epoch": 51_200}).status_code == 201
    lower = api.post(url, json={**state, "step": 150})
    assert lower.status_code == 409
    assert "lower than" in lower.json()["detail"]
    assert "200" in lower.json()["detail"]
    # an old step can still be re-committed with its own state (a retry), and read back
    assert api.post(url, json=state).status_code == 200
    assert api.get(f"{url}/latest").json()["step"] == 200
    assert api.get(f"{url}/100").json()["sample_in_epoch"] == 25_600
    assert api.get(f"{url}/150").status_code == 404
    listed = api.get(url, params={"limit": 1}).json()
    assert [c["step"] for c in listed["items"]] == [100]
    assert [
        c["step"] for c in api.get(url, params={"cursor": listed["next_cursor"]}).json()["items"]
    ] == [200]
    assert api.post(url, json={**state, "step": -1}).status_code == 422
    assert api.post("/v1/runs/999/checkpoints", json=state).status_code == 404


def test_metrics_count_checkpoint_commits(api: TestClient, tmp_path: Path) -> None:
    run = mixed_run(api, tmp_path)
    url = f"/v1/runs/{run['id']}/checkpoints"
    state = {"step": 1, "epoch": 0, "sample_in_epoch": 8}
    api.post(url, json=state)
    api.post(url, json=state)
    api.post(url, json={**state, "epoch": 3})
    text = api.get("/metrics").text
    assert 'shardstream_checkpoint_commits_total{result="created"} 1.0' in text
    assert 'shardstream_checkpoint_commits_total{result="unchanged"} 1.0' in text
    assert 'shardstream_checkpoint_commits_total{result="conflict"} 1.0' in text
    assert 'shardstream_runs{status="running"} 1.0' in text
    assert 'shardstream_versions{status="published"} 2.0' in text
    assert 'shardstream_datasets{status="all"} 2.0' in text
    assert 'route="/v1/runs/{run_id}/checkpoints",status="409"' in text
    assert (
        "shardstream_http_request_duration_seconds_count"
        '{method="POST",route="/v1/runs/{run_id}/checkpoints"} 3.0' in text
    )


def test_run_ids_past_the_id_column_get_the_same_answer_on_every_backend(
    api: TestClient, tmp_path: Path
) -> None:
    """Run ids are 32-bit columns: ids from 2**31 used to be a 404 on SQLite and a 422
    ("out of range for the database") on PostgreSQL. Both now refuse them alike, naming
    the parameter and its bound; the largest valid id is an ordinary 404."""
    run = mixed_run(api, tmp_path)
    commit = {"step": 1, "epoch": 0, "sample_in_epoch": 256}
    for run_id in (2**31, 2**40, 2**62):
        answers = [
            api.get(f"/v1/runs/{run_id}"),
            api.patch(f"/v1/runs/{run_id}", json={"status": "completed"}),
            api.get(f"/v1/runs/{run_id}/checkpoints"),
            api.get(f"/v1/runs/{run_id}/checkpoints/latest"),
            api.get(f"/v1/runs/{run_id}/checkpoints/1"),
            api.post(f"/v1/runs/{run_id}/checkpoints", json=commit),
        ]
        for answer in answers:
            assert answer.status_code == 422, (answer.request.url, answer.text)
            assert "path.run_id" in answer.json()["detail"]
            assert str(2**31 - 1) in answer.json()["detail"]
        page = api.get("/v1/runs", params={"cursor": str(run_id)})
        assert page.status_code == 422, page.text
        assert "query.cursor" in page.json()["detail"]
    assert api.get(f"/v1/runs/{2**31 - 1}").status_code == 404
    versions = api.get("/v1/datasets/a/versions", params={"cursor": str(2**31)})
    assert versions.status_code == 422, versions.text  # version numbers are 32-bit too
    assert api.get(f"/v1/runs/{run['id']}").status_code == 200
