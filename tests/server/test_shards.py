"""The shard index (keyset pages, streamed index.json) and presigned URLs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import event

from shardstream.mds import MDSWriter, load_index
from shardstream.shard_builder.publish import shard_record
from shardstream.wire import Page, ShardRecord
from tests.fixtures.s3 import S3Bucket
from tests.server.conftest import make_published, shard


def test_pages_cover_a_large_index_exactly_once(api: TestClient, tmp_path: Path) -> None:
    """20k shards: every page is a keyset range; together they are the index, in order."""
    api.post("/v1/datasets", json={"name": "big"})
    root = tmp_path / "big"
    v = api.post(
        "/v1/datasets/big/versions", json={"columns": {}, "storage_root": root.as_uri()}
    ).json()
    total = 20_000
    url = f"/v1/datasets/big/versions/{v['number']}"
    for start in range(0, total, 5000):
        body = {
            "shards": [shard(i, size=1, key=f"d{i % 7}/s{i}") for i in range(start, start + 5000)]
        }
        assert api.post(f"{url}/shards", json=body).status_code == 200
    seen = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 7000} | ({"cursor": cursor} if cursor else {})
        page = api.get(f"{url}/shards", params=params).json()
        Page[ShardRecord].model_validate(page)  # the fast path keeps the documented schema
        seen += [s["index"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(range(total))
    assert api.get(f"{url}/shards", params={"limit": 10_001}).status_code == 422
    assert api.get(f"{url}/shards", params={"cursor": "x"}).status_code == 422
    assert api.get(url).json()["num_shards"] == total


def _mds_draft(api: TestClient, root: Path, name: str) -> tuple[str, object]:
    """A draft of MDS shards written under ``root``, registered with their index entries:
    (its API path, the written index)."""
    with MDSWriter(root, {"x": "int", "t": "str"}, compression="zstd", size_limit=1 << 10) as w:
        for i in range(300):
            w.write({"x": i, "t": "s" * (i % 50)})
    index = load_index(root / "index.json")
    assert len(index.shards) > 3
    api.post("/v1/datasets", json={"name": name})
    v = api.post(
        f"/v1/datasets/{name}/versions",
        json={"columns": {"x": "int"}, "storage_root": root.as_uri()},
    ).json()
    base = f"/v1/datasets/{name}/versions/{v['number']}"
    records = [shard_record(i, s).model_dump(mode="json") for i, s in enumerate(index.shards)]
    assert api.post(f"{base}/shards", json={"shards": records}).status_code == 200
    return base, index


def test_index_json_is_the_mds_index(api: TestClient, tmp_path: Path) -> None:
    base, index = _mds_draft(api, tmp_path / "mds", "m")
    assert api.get(f"{base}/index.json").status_code == 409  # drafts have no index yet
    assert api.post(f"{base}/publish").status_code == 200
    r = api.get(f"{base}/index.json")
    assert r.status_code == 200
    assert load_index(r.content) == index
    assert json.loads(r.content)["version"] == 2
    assert (
        api.get(f"{base}/index.json", headers={"If-None-Match": r.headers["etag"]}).status_code
        == 304
    )


def test_index_json_of_a_published_version_is_served_from_memory(
    api: TestClient, tmp_path: Path
) -> None:
    # One request builds it; the next ones (plain and gzip, each with its own ETag) cost no
    # query: index.json cost ~16 ms of server CPU per request streamed from the database.
    base, index = _mds_draft(api, tmp_path / "mem", "mem")
    assert api.post(f"{base}/publish").status_code == 200
    path = f"{base}/index.json"
    plain = api.get(path, headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200 and load_index(plain.content) == index
    statements: list[str] = []
    engine = api.app.state.engine  # type: ignore[attr-defined]

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", count)
    try:
        again = api.get(path, headers={"Accept-Encoding": "identity"})
        zipped = api.get(path, headers={"Accept-Encoding": "gzip"})
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert again.content == plain.content
    assert zipped.headers["content-encoding"] == "gzip" and zipped.content == plain.content
    assert zipped.headers["etag"] != plain.headers["etag"]
    assert "Accept-Encoding" in zipped.headers["vary"]
    assert not [s for s in statements if "shards" in s], statements
    for r, encoding in ((plain, "identity"), (zipped, "gzip")):
        headers = {"If-None-Match": r.headers["etag"], "Accept-Encoding": encoding}
        assert api.get(path, headers=headers).status_code == 304


def test_presign_local_gives_file_urls(api: TestClient, tmp_path: Path) -> None:
    v = make_published(api, "loc", tmp_path / "loc", shards=3)
    base = f"/v1/datasets/loc/versions/{v['number']}"
    r = api.post(f"{base}/presign", json={"keys": ["shard.00000.mds", "shard.00002.mds"]})
    assert r.status_code == 200, r.text
    urls = r.json()["urls"]
    assert set(urls) == {"shard.00000.mds", "shard.00002.mds"}
    path = Path(urlparse(urls["shard.00002.mds"]).path)
    assert path == tmp_path / "loc" / "shard.00002.mds"
    assert path.read_bytes() == b"x" * 10
    unknown = api.post(f"{base}/presign", json={"keys": ["nope.mds"]})
    assert unknown.status_code == 404
    assert "nope.mds" in unknown.json()["detail"]
    escape = api.post(f"{base}/presign", json={"keys": ["../x"]})
    assert escape.status_code == 422
    assert api.post(f"{base}/presign", json={"keys": []}).status_code == 422


def test_presign_s3_urls_work_without_credentials(
    api: TestClient, s3_bucket: S3Bucket, monkeypatch: object
) -> None:
    client = s3_bucket.client()
    payloads = {f"v1/shard.{i:05d}.mds": np.random.default_rng(i).bytes(100 + i) for i in range(3)}
    for key, data in payloads.items():
        client.put_object(Bucket=s3_bucket.name, Key=key, Body=data)
    api.post("/v1/datasets", json={"name": "s3ds"})
    v = api.post(
        "/v1/datasets/s3ds/versions",
        json={"columns": {}, "storage_root": f"{s3_bucket.url}/v1"},
    ).json()
    base = f"/v1/datasets/s3ds/versions/{v['number']}"
    records = [shard(i, size=100 + i) for i in range(3)]
    records[1]["stored_bytes"] = 5  # wrong size: publish must refuse
    assert api.post(f"{base}/shards", json={"shards": records}).status_code == 200
    refused = api.post(f"{base}/publish")
    assert refused.status_code == 409
    assert "shard.00001.mds" in refused.json()["detail"]
    assert api.post(f"{base}/abort").status_code == 200

    v = api.post(
        "/v1/datasets/s3ds/versions",
        json={"columns": {}, "storage_root": f"{s3_bucket.url}/v1"},
    ).json()
    base = f"/v1/datasets/s3ds/versions/{v['number']}"
    api.post(f"{base}/shards", json={"shards": [shard(i, size=100 + i) for i in range(3)]})
    assert api.post(f"{base}/publish").status_code == 200
    r = api.post(f"{base}/presign", json={"keys": ["shard.00001.mds"], "expires_s": 60})
    assert r.status_code == 200, r.text
    body = r.json()
    url = body["urls"]["shard.00001.mds"]
    assert "X-Amz-Signature" in url or "Signature" in url
    # a plain HTTP GET with no AWS credentials fetches the bytes
    assert httpx.get(url).content == payloads["v1/shard.00001.mds"]
    expires = body["expires_at"]
    assert expires > time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def test_presign_signs_for_the_public_endpoint(
    app: object, settings: object, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """With SHARDSTREAM_S3_PUBLIC_ENDPOINT_URL the URL names the endpoint clients reach
    (the server itself talks to AWS_ENDPOINT_URL), and it works there."""
    from fastapi.testclient import TestClient as Client

    from shardstream.server.app import create_app
    from shardstream.server.config import Settings

    assert isinstance(settings, Settings)
    public = s3_bucket.endpoint_url.replace("127.0.0.1", "localhost")
    application = create_app(settings.model_copy(update={"s3_public_endpoint_url": public}))
    s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="p/a.mds", Body=b"abc")
    with Client(
        application, headers={"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}
    ) as api:  # type: ignore[union-attr]
        api.post("/v1/datasets", json={"name": "pub"})
        api.post(
            "/v1/datasets/pub/versions", json={"columns": {}, "storage_root": f"{s3_bucket.url}/p"}
        )
        api.post(
            "/v1/datasets/pub/versions/1/shards", json={"shards": [shard(0, key="a.mds", size=3)]}
        )
        assert api.post("/v1/datasets/pub/versions/1/publish").status_code == 200
        url = api.post("/v1/datasets/pub/versions/1/presign", json={"keys": ["a.mds"]}).json()[
            "urls"
        ]["a.mds"]
    assert url.startswith(public)
    assert httpx.get(url).content == b"abc"
    application.state.engine.dispose()


def test_large_pages_are_sent_gzipped_to_clients_that_take_it(
    api: TestClient, tmp_path: Path
) -> None:
    version = make_published(api, "gz", tmp_path / "gz", shards=300)
    url = f"/v1/datasets/gz/versions/{version['number']}/shards"
    plain = api.get(url, params={"limit": 300}, headers={"Accept-Encoding": "identity"})
    packed = api.get(url, params={"limit": 300}, headers={"Accept-Encoding": "br, gzip;q=0.5"})
    assert plain.status_code == packed.status_code == 200
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert plain.headers["vary"] == packed.headers["vary"] == "Accept-Encoding"
    assert packed.json() == plain.json() and len(plain.json()["items"]) == 300
    assert packed.num_bytes_downloaded * 4 < plain.num_bytes_downloaded
    # Two representations, two strong ETags; each revalidates only its own.
    assert packed.headers["etag"] == plain.headers["etag"][:-1] + '.gz"'
    again = api.get(
        url,
        params={"limit": 300},
        headers={"Accept-Encoding": "gzip", "If-None-Match": packed.headers["etag"]},
    )
    assert again.status_code == 304 and again.headers["etag"] == packed.headers["etag"]
    switched = api.get(
        url,
        params={"limit": 300},
        headers={"Accept-Encoding": "gzip", "If-None-Match": plain.headers["etag"]},
    )
    assert switched.status_code == 200 and switched.json() == plain.json()
    # Small pages and refusals stay plain.
    small = api.get(url, params={"limit": 99}, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in small.headers
    refused = api.get(url, params={"limit": 300}, headers={"Accept-Encoding": "gzip;q=0, *;q=0"})
    assert "content-encoding" not in refused.headers and refused.json() == plain.json()


def test_draft_pages_are_never_compressed(api: TestClient, tmp_path: Path) -> None:
    api.post("/v1/datasets", json={"name": "gzd"})
    v = api.post(
        "/v1/datasets/gzd/versions", json={"columns": {}, "storage_root": (tmp_path / "d").as_uri()}
    ).json()
    url = f"/v1/datasets/gzd/versions/{v['number']}/shards"
    body = {"shards": [shard(i) for i in range(200)]}
    assert api.post(url, json=body).status_code == 200
    page = api.get(url, params={"limit": 200}, headers={"Accept-Encoding": "gzip"})
    assert page.status_code == 200 and len(page.json()["items"]) == 200
    assert "content-encoding" not in page.headers and "etag" not in page.headers
    assert page.headers["cache-control"] == "no-store"
