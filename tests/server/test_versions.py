"""Versions: drafts, shard batches, publish (storage-checked, atomic), abort, immutability."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.server.conftest import make_published, shard


def _draft(api: TestClient, root: Path | None = None, name: str = "wiki") -> int:
    if api.get(f"/v1/datasets/{name}").status_code == 404:
        api.post("/v1/datasets", json={"name": name})
    body: dict[str, object] = {
        "columns": {"tokens": "ndarray:int32:2048"},
        "builder_config": {"tokenizer": "gpt2"},
        "lineage": {"source": "s3://raw/wiki"},
    }
    if root is not None:
        body["storage_root"] = root.as_uri()
    r = api.post(f"/v1/datasets/{name}/versions", json=body)
    assert r.status_code == 201, r.text
    number: int = r.json()["number"]
    return number


def test_draft_fields_and_default_storage_root(api: TestClient, storage_dir: Path) -> None:
    n = _draft(api)
    v = api.get(f"/v1/datasets/wiki/versions/{n}").json()
    assert v["status"] == "draft"
    # The server places it: <default root>/<name>-<random id>/v<number>
    home, _, last = v["storage_root"].rpartition("/")
    assert last == "v1" and home.startswith((storage_dir / "wiki-").as_uri())
    assert v["builder_config"] == {"tokenizer": "gpt2"}
    assert v["lineage"] == {"source": "s3://raw/wiki"}
    second = api.get(f"/v1/datasets/wiki/versions/{_draft(api)}").json()
    assert (second["number"], second["storage_root"]) == (2, f"{home}/v2")


def test_storage_root_validation(api: TestClient) -> None:
    api.post("/v1/datasets", json={"name": "wiki"})
    for bad in ["relative/dir", "ftp://x/y", "s3://", "file:///a/../b"]:
        r = api.post("/v1/datasets/wiki/versions", json={"columns": {}, "storage_root": bad})
        assert r.status_code == 422, bad
        assert "storage_root" in r.json()["detail"]


def test_shard_keys_cannot_escape_the_root(api: TestClient) -> None:
    n = _draft(api)
    for bad in ["../x.mds", "/etc/passwd", "a//b", "a/./b", "a\\b", "s3://b/k", "x\x00"]:
        r = api.post(f"/v1/datasets/wiki/versions/{n}/shards", json={"shards": [shard(0, key=bad)]})
        assert r.status_code == 422, bad
        assert "shards[0].key" in r.json()["detail"]


def test_batches_retries_and_gaps(api: TestClient) -> None:
    n = _draft(api)
    url = f"/v1/datasets/wiki/versions/{n}/shards"
    first = {"shards": [shard(i) for i in range(3)]}
    r = api.post(url, json=first)
    assert r.json() == {"num_shards": 3, "total_samples": 9, "total_bytes": 30}
    assert api.post(url, json=first).json()["num_shards"] == 3  # retried batch: no-op
    overlap = {"shards": [shard(i) for i in range(2, 5)]}
    assert api.post(url, json=overlap).json()["num_shards"] == 5
    changed = {"shards": [shard(1, size=99)]}
    assert api.post(url, json=changed).status_code == 409
    gap = api.post(url, json={"shards": [shard(9)]})
    assert gap.status_code == 409
    assert "start at index 5" in gap.json()["detail"]
    nonconsecutive = api.post(url, json={"shards": [shard(5), shard(7)]})
    assert nonconsecutive.status_code == 422
    dup_key = api.post(url, json={"shards": [shard(5, key="shard.00000.mds")]})
    assert dup_key.status_code == 409
    assert "shard.00000.mds" in dup_key.json()["detail"]
    assert api.post(url, json={"shards": []}).status_code == 422


def test_publish_checks_storage(api: TestClient, tmp_path: Path) -> None:
    root = tmp_path / "v"
    root.mkdir()
    n = _draft(api, root)
    base = f"/v1/datasets/wiki/versions/{n}"
    empty = api.post(f"{base}/publish")
    assert empty.status_code == 409
    assert "no shards" in empty.json()["detail"]
    api.post(f"{base}/shards", json={"shards": [shard(0, size=4), shard(1, size=4)]})
    (root / "shard.00000.mds").write_bytes(b"abcd")
    missing = api.post(f"{base}/publish")
    assert missing.status_code == 409
    assert "shard.00001.mds" in missing.json()["detail"]
    assert "missing" in missing.json()["detail"]
    (root / "shard.00001.mds").write_bytes(b"abc")
    wrong = api.post(f"{base}/publish")
    assert wrong.status_code == 409
    assert "3 bytes" in wrong.json()["detail"]
    assert api.get(base).json()["status"] == "draft"  # nothing half-published
    (root / "shard.00001.mds").write_bytes(b"abcd")
    ok = api.post(f"{base}/publish")
    assert ok.status_code == 200
    assert ok.json()["status"] == "published"
    assert ok.json()["published_at"] is not None
    assert api.post(f"{base}/publish").json()["status"] == "published"  # idempotent


def test_publish_many_shards_lists_storage_once(api: TestClient, tmp_path: Path) -> None:
    root = tmp_path / "many"
    n = _draft(api, root)
    for i in range(100):
        (root / "sub").mkdir(parents=True, exist_ok=True)
        (root / "sub" / f"s{i}.mds").write_bytes(b"x" * 10)
    body = {"shards": [shard(i, key=f"sub/s{i}.mds") for i in range(100)]}
    api.post(f"/v1/datasets/wiki/versions/{n}/shards", json=body)
    (root / "sub" / "s57.mds").write_bytes(b"x" * 11)
    r = api.post(f"/v1/datasets/wiki/versions/{n}/publish")
    assert r.status_code == 409
    assert "sub/s57.mds" in r.json()["detail"]
    (root / "sub" / "s57.mds").write_bytes(b"x" * 10)
    assert api.post(f"/v1/datasets/wiki/versions/{n}/publish").status_code == 200


def test_published_is_immutable_and_abort(api: TestClient, tmp_path: Path) -> None:
    v = make_published(api, "wiki", tmp_path / "p")
    base = f"/v1/datasets/wiki/versions/{v['number']}"
    add = api.post(f"{base}/shards", json={"shards": [shard(3)]})
    assert add.status_code == 409
    assert "immutable" in add.json()["detail"]
    assert api.post(f"{base}/abort").status_code == 409
    n = _draft(api)
    assert api.post(f"/v1/datasets/wiki/versions/{n}/shards", json={"shards": [shard(0)]})
    aborted = api.post(f"/v1/datasets/wiki/versions/{n}/abort")
    assert aborted.json()["status"] == "aborted"
    assert api.post(f"/v1/datasets/wiki/versions/{n}/abort").status_code == 200
    assert api.post(f"/v1/datasets/wiki/versions/{n}/publish").status_code == 409
    latest = api.get("/v1/datasets/wiki/versions/latest").json()
    assert latest["number"] == v["number"]
    listed = api.get("/v1/datasets/wiki/versions", params={"limit": 1}).json()
    assert [x["number"] for x in listed["items"]] == [1]
    assert listed["next_cursor"] == "1"


def test_etag_and_cache_headers(api: TestClient, tmp_path: Path) -> None:
    n = _draft(api)
    draft = api.get(f"/v1/datasets/wiki/versions/{n}")
    assert draft.headers["cache-control"] == "no-store"
    assert "etag" not in draft.headers
    v = make_published(api, "wiki", tmp_path / "p")
    url = f"/v1/datasets/wiki/versions/{v['number']}"
    first = api.get(url)
    etag = first.headers["etag"]
    assert "immutable" in first.headers["cache-control"]
    assert "max-age=31536000" in first.headers["cache-control"]
    again = api.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert api.get(url, headers={"If-None-Match": '"other"'}).status_code == 200
    page = api.get(f"{url}/shards", params={"limit": 2})
    assert page.headers["etag"] != etag
    assert (
        api.get(
            f"{url}/shards", params={"limit": 2}, headers={"If-None-Match": page.headers["etag"]}
        ).status_code
        == 304
    )


def test_missing_version_404(api: TestClient) -> None:
    api.post("/v1/datasets", json={"name": "wiki"})
    r = api.get("/v1/datasets/wiki/versions/7")
    assert r.status_code == 404
    assert "version 7" in r.json()["detail"]
    assert api.get("/v1/datasets/wiki/versions/latest").status_code == 404
    assert api.get("/v1/datasets/wiki/versions/0").status_code == 422


def test_update_draft_before_shards(api: TestClient, tmp_path: Path) -> None:
    n = _draft(api)
    url = f"/v1/datasets/wiki/versions/{n}"
    r = api.patch(url, json={"columns": {"a": "str"}, "storage_root": str(tmp_path / "out")})
    assert r.status_code == 200
    assert (r.json()["columns"], r.json()["storage_root"]) == (
        {"a": "str"},
        (tmp_path / "out").as_uri(),
    )
    assert r.json()["lineage"] == {"source": "s3://raw/wiki"}  # unset fields unchanged
    api.post(f"{url}/shards", json={"shards": [shard(0)]})
    moved = api.patch(url, json={"storage_root": str(tmp_path / "elsewhere")})
    assert moved.status_code == 409
    assert "storage root" in moved.json()["detail"]
    assert api.patch(url, json={"lineage": {"k": 1}}).json()["lineage"] == {"k": 1}
    api.post(f"{url}/abort")
    assert api.patch(url, json={"lineage": {}}).status_code == 409
