"""A token reaches only its own datasets' bytes: storage locations are the server's decision.

A write token restricted to dataset ``gamma`` tries every way of pointing the server at
objects outside gamma's location (the bucket root, another bucket, another dataset's
prefix, local paths, ``http://`` URLs, percent-encoded ``..``, absolute and ``../`` keys).
The tests assert the effect: no presigned URL the server hands out ever returns the
secret objects' bytes, errors name nothing outside gamma, and nothing connects to an
``http`` URL. Admins register existing datasets in place only inside a configured root.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session

from shardstream.server.config import Settings
from shardstream.server.db import make_engine
from shardstream.server.models import DatasetRow, ShardRow, VersionRow
from tests.fixtures.postgres import truncate_all
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer, start_server

SECRET = b"the other team's secret bytes " * 20


class World:
    """A live server whose storage root is ``s3://<bucket>/teams``, with secrets around it."""

    def __init__(self, live: LiveServer, bucket: S3Bucket, other_bucket: str) -> None:
        self.live = live
        self.bucket = bucket
        self.other_bucket = other_bucket
        self.admin = httpx.Client(base_url=live.url, headers=live.headers, timeout=30)
        self.seen_urls: list[str] = []
        s3 = bucket.client()
        s3.put_object(Bucket=bucket.name, Key="secret.bin", Body=SECRET)
        s3.put_object(Bucket=bucket.name, Key="teams/secret.bin", Body=SECRET)
        s3.put_object(Bucket=other_bucket, Key="secret.bin", Body=SECRET)
        # Dataset alpha, published by the admin, with the secret as its shard.
        self.alpha_root = self.publish_one("alpha", SECRET)
        token = self.admin.post(
            "/v1/tokens", json={"name": "gamma-writer", "scopes": ["write"], "datasets": ["gamma"]}
        )
        assert token.status_code == 201, token.text
        self.gamma = httpx.Client(
            base_url=live.url,
            headers={"Authorization": f"Bearer {token.json()['secret']}"},
            timeout=30,
        )

    def publish_one(self, dataset: str, body: bytes, client: httpx.Client | None = None) -> str:
        """Publish a one-shard version of ``dataset`` where the server places it."""
        client = client or self.admin
        if self.admin.get(f"/v1/datasets/{dataset}").status_code == 404:
            assert self.admin.post("/v1/datasets", json={"name": dataset}).status_code == 201
        draft = client.post(f"/v1/datasets/{dataset}/versions", json={"columns": {"x": "int"}})
        assert draft.status_code == 201, draft.text
        root, number = draft.json()["storage_root"], draft.json()["number"]
        assert root.startswith(f"{self.bucket.url}/teams/{dataset}-")
        prefix = root.removeprefix(f"{self.bucket.url}/")
        self.bucket.client().put_object(Bucket=self.bucket.name, Key=f"{prefix}/s.bin", Body=body)
        shards = {"shards": [shard_record("s.bin", len(body))]}
        base = f"/v1/datasets/{dataset}/versions/{number}"
        assert client.post(f"{base}/shards", json=shards).status_code == 200
        assert client.post(f"{base}/publish").status_code == 200
        return str(root)

    def presign(self, client: httpx.Client, dataset: str, number: int, keys: list[str]) -> int:
        """Ask for URLs; remember every URL handed out; return the status."""
        r = client.post(f"/v1/datasets/{dataset}/versions/{number}/presign", json={"keys": keys})
        if r.status_code == 200:
            self.seen_urls.extend(r.json()["urls"].values())
        return r.status_code

    def assert_no_url_serves_the_secret(self) -> None:
        assert self.seen_urls, "the test should have obtained some URLs"
        for url in self.seen_urls:
            if url.startswith("file://"):
                path = Path(url.removeprefix("file://"))
                assert not path.exists() or path.read_bytes() != SECRET, url
            else:
                assert httpx.get(url).content != SECRET, url


def shard_record(key: str, size: int) -> dict[str, Any]:
    return {
        "index": 0,
        "key": key,
        "samples": 1,
        "raw_bytes": size,
        "stored_bytes": size,
        "hashes": {"sha1": "0" * 40},
    }


@pytest.fixture
def world(db_url: str, tmp_path: Path, s3_bucket: S3Bucket) -> Iterator[World]:
    engine = make_engine(db_url)
    truncate_all(engine)
    engine.dispose()
    other = f"{s3_bucket.name}-other"
    s3 = s3_bucket.client()
    s3.create_bucket(Bucket=other)
    local_root = tmp_path / "local-root"
    local_root.mkdir()
    with start_server(
        tmp_path / "srv",
        database_url=db_url,
        migrate_on_start=False,
        storage_root=f"{s3_bucket.url}/teams",
        storage_roots=local_root.as_uri(),
    ) as live:
        yield World(live, s3_bucket, other)
    for obj in s3.list_objects_v2(Bucket=other).get("Contents", []):
        s3.delete_object(Bucket=other, Key=obj["Key"])
    s3.delete_bucket(Bucket=other)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback socket that nobody should ever connect to."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    with pytest.raises(BlockingIOError):
        sock.accept()  # nobody connected: the server fetched no client-chosen URL
    sock.close()


def test_a_writer_cannot_reach_outside_its_dataset(world: World, listener: socket.socket) -> None:
    b, gamma = world.bucket, world.gamma
    http_url = f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    roots = [
        b.url,
        f"{b.url}/teams",
        f"s3://{world.other_bucket}",
        world.alpha_root,
        world.alpha_root.rsplit("/", 1)[0],
        "/etc",
        "file:///",
        "file:///etc",
        http_url,
        f"{b.url}/teams/gamma/%2e%2e/%2e%2e",
        f"{b.url}/teams/%2E%2E",
    ]
    assert world.admin.post("/v1/datasets", json={"name": "gamma"}).status_code == 201
    for root in roots:
        r = gamma.post("/v1/datasets/gamma/versions", json={"columns": {}, "storage_root": root})
        assert r.status_code == 403, (root, r.text)
        assert "storage_root" in r.json()["detail"]
    draft = gamma.post("/v1/datasets/gamma/versions", json={"columns": {"x": "int"}}).json()
    base = f"/v1/datasets/gamma/versions/{draft['number']}"
    for root in roots:
        r = gamma.patch(base, json={"storage_root": root})
        assert r.status_code == 403, (root, r.text)
    assert gamma.patch(base, json={"storage_root": draft["storage_root"]}).status_code == 200
    keys = [
        "../secret.bin",
        "../../secret.bin",
        "../../../secret.bin",
        "%2e%2e/%2e%2e/secret.bin",
        "..%2f..%2fsecret.bin",
        "a/%2E%2E/%2e%2e/%2e%2e/secret.bin",
        f"{b.url}/secret.bin",
        f"s3://{world.other_bucket}/secret.bin",
        "/etc/passwd",
        http_url,
        "..\\..\\secret.bin",
        "secret.bin\x00",
        "?x=../secret.bin",
    ]
    for key in keys:
        r = gamma.post(f"{base}/shards", json={"shards": [shard_record(key, len(SECRET))]})
        assert r.status_code == 422, (key, r.text)
    # A key inside gamma's location that does not exist: the error names only gamma's own.
    r = gamma.post(f"{base}/shards", json={"shards": [shard_record("secret.bin", 1)]})
    assert r.status_code == 200, r.text
    failed = gamma.post(f"{base}/publish")
    assert failed.status_code == 409
    detail = failed.json()["detail"]
    assert "secret.bin" in detail and draft["storage_root"] in detail
    # The storage root holds random hex, so look for the secret's size outside it.
    outside_root = detail.replace(draft["storage_root"], "")
    assert str(len(SECRET)) not in outside_root and world.other_bucket not in detail
    assert detail.count("s3://") == 1  # gamma's own key, nothing else
    gamma.post(f"{base}/abort")

    # A published gamma version: presign only ever signs gamma's own keys.
    world.publish_one("gamma", b"gamma's own bytes", client=gamma)
    number = gamma.get("/v1/datasets/gamma/versions/latest").json()["number"]
    assert world.presign(gamma, "gamma", number, ["s.bin"]) == 200
    for key in ["../secret.bin", "%2e%2e/secret.bin", "../" + world.alpha_root, "secret.bin"]:
        assert world.presign(gamma, "gamma", number, [key]) in (404, 422), key
    assert world.presign(gamma, "alpha", 1, ["s.bin"]) == 403
    assert httpx.get(world.seen_urls[0]).content == b"gamma's own bytes"
    world.assert_no_url_serves_the_secret()


def test_rows_outside_the_roots_are_never_served(world: World, db_url: str) -> None:
    """A version row written before confinement (pointing at the bucket root) is inert."""
    assert world.admin.post("/v1/datasets", json={"name": "gamma"}).status_code == 201
    engine = make_engine(db_url)
    with Session(engine) as session:
        gamma = session.query(DatasetRow).filter_by(name="gamma").one()
        old = VersionRow(
            dataset_id=gamma.id,
            number=1,
            status="published",
            columns={"x": "int"},
            storage_root=world.bucket.url,
            builder_config={},
            lineage={},
            created_by="an old client",
            num_shards=1,
            total_samples=1,
            total_bytes=len(SECRET),
            total_raw_bytes=len(SECRET),
        )
        session.add(old)
        session.flush()
        session.add(
            ShardRow(
                version_id=old.id,
                idx=0,
                key="secret.bin",
                samples=1,
                raw_bytes=len(SECRET),
                stored_bytes=len(SECRET),
                hashes={},
            )
        )
        import datetime

        old.published_at = datetime.datetime.now(datetime.UTC)
        session.commit()
    engine.dispose()
    r = world.gamma.post("/v1/datasets/gamma/versions/1/presign", json={"keys": ["secret.bin"]})
    assert r.status_code == 409, r.text
    assert "outside the server's storage roots" in r.json()["detail"]
    assert "urls" not in r.json()
    # The next draft goes to a location the server chose, inside its root.
    draft = world.gamma.post("/v1/datasets/gamma/versions", json={"columns": {}}).json()
    assert draft["storage_root"].startswith(f"{world.bucket.url}/teams/gamma-")


def test_admin_registers_in_place_only_inside_a_root(world: World, listener: socket.socket) -> None:
    b, admin = world.bucket, world.admin
    s3 = b.client()
    s3.put_object(Bucket=b.name, Key="teams/imported/wiki/s.bin", Body=b"imported")
    assert admin.post("/v1/datasets", json={"name": "wiki"}).status_code == 201
    alpha_home = world.alpha_root.rsplit("/", 1)[0]
    refused = {
        f"{b.url}/elsewhere": 422,  # outside every root
        f"{b.url}/teams": 422,  # a root itself
        f"s3://{world.other_bucket}/teams/x": 422,
        "/etc": 422,
        f"http://127.0.0.1:{listener.getsockname()[1]}/x": 422,
        f"{b.url}/teams/imported/%2e%2e/%2e%2e/elsewhere": 422,
        f"{b.url}/teams/imported/..": 422,
        f"{b.url}/teams/a\\..\\..": 422,
        world.alpha_root: 409,  # another dataset's version
        f"{alpha_home}/inside": 409,  # inside another dataset's location
    }
    for root, expected in refused.items():
        r = admin.post("/v1/datasets/wiki/versions", json={"columns": {}, "storage_root": root})
        assert r.status_code == expected, (root, r.text)
        assert "storage_root" in r.json()["detail"]
    root = f"{b.url}/teams/imported/wiki"
    draft = admin.post("/v1/datasets/wiki/versions", json={"columns": {}, "storage_root": root})
    assert draft.status_code == 201, draft.text
    assert draft.json()["storage_root"] == root
    base = "/v1/datasets/wiki/versions/1"
    assert admin.post(f"{base}/shards", json={"shards": [shard_record("s.bin", 8)]}).is_success
    assert admin.post(f"{base}/publish").status_code == 200
    assert world.presign(admin, "wiki", 1, ["s.bin"]) == 200
    assert httpx.get(world.seen_urls[-1]).content == b"imported"


def test_settings_refuse_roots_the_server_must_not_use() -> None:
    for bad in ["http://example.com/x", "https://h/x", "file:///", "s3://b/a/../c", "ftp://h/x"]:
        with pytest.raises(ValidationError, match="storage root"):
            Settings(storage_roots=f"s3://fine/x,{bad}")
    settings = Settings(storage_root="s3://bucket/a/", storage_roots="/data/x,s3://bucket/a")
    assert [r.url for r in settings.resolved_storage_roots] == ["s3://bucket/a", "file:///data/x"]
    relative = Settings(storage_root="shards").resolved_storage_root
    assert relative == (Path.cwd() / "shards").as_uri()


def test_a_local_link_out_of_the_root_is_not_published(db_url: str, tmp_path: Path) -> None:
    """A builder with file-system access links a "shard" to a file outside the root: the
    publish check refuses it without revealing the target's size."""
    engine = make_engine(db_url)
    truncate_all(engine)
    engine.dispose()
    secret = tmp_path / "elsewhere" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    root = tmp_path / "root"
    with start_server(
        tmp_path / "srv", database_url=db_url, migrate_on_start=False, storage_root=str(root)
    ) as live:
        api = httpx.Client(base_url=live.url, headers=live.headers, timeout=30)
        assert api.post("/v1/datasets", json={"name": "gamma"}).status_code == 201
        draft = api.post("/v1/datasets/gamma/versions", json={"columns": {}}).json()
        here = Path(draft["storage_root"].removeprefix("file://"))
        here.mkdir(parents=True)
        (here / "s.bin").symlink_to(secret)
        base = f"/v1/datasets/gamma/versions/{draft['number']}"
        record = shard_record("s.bin", len(SECRET) + 1)
        assert api.post(f"{base}/shards", json={"shards": [record]}).status_code == 200
        failed = api.post(f"{base}/publish")
        assert failed.status_code == 409, failed.text
        assert "leaves the version's storage root" in failed.json()["detail"]
        assert str(len(SECRET)) not in failed.json()["detail"]
        assert api.get(f"{base}").json()["status"] == "draft"
        # An admin cannot register a whole root (nested roots included) either.
        nested = api.post(
            "/v1/datasets/gamma/versions", json={"columns": {}, "storage_root": str(root)}
        )
        assert nested.status_code == 422 and "storage root" in nested.json()["detail"]


def test_an_overlap_names_only_datasets_the_admin_may_see(world: World) -> None:
    """A dataset-restricted admin whose registration overlaps another dataset's storage is
    refused without learning that dataset's name; an admin over every dataset is told."""
    b, admin = world.bucket, world.admin
    assert admin.post("/v1/datasets", json={"name": "hiddenproject"}).status_code == 201
    vault = f"{b.url}/teams/vault/q7"  # its folder does not give the name away
    hidden = {"columns": {}, "storage_root": vault}
    assert admin.post("/v1/datasets/hiddenproject/versions", json=hidden).status_code == 201
    assert admin.post("/v1/datasets", json={"name": "wiki"}).status_code == 201
    token = admin.post(
        "/v1/tokens", json={"name": "wiki-admin", "scopes": ["admin"], "datasets": ["wiki"]}
    )
    assert token.status_code == 201, token.text
    headers = {"Authorization": f"Bearer {token.json()['secret']}"}
    with httpx.Client(base_url=world.live.url, headers=headers, timeout=30) as restricted:
        over = {"columns": {}, "storage_root": f"{b.url}/teams/vault"}
        for answer in (
            restricted.post("/v1/datasets/wiki/versions", json=over),
            restricted.post("/v1/datasets/wiki/versions", json={**over, "storage_root": vault}),
        ):
            assert answer.status_code == 409, answer.text
            assert "another dataset" in answer.json()["detail"]
            assert "hiddenproject" not in answer.text
        draft = restricted.post("/v1/datasets/wiki/versions", json={"columns": {}})
        assert draft.status_code == 201, draft.text
        moved = restricted.patch(f"/v1/datasets/wiki/versions/{draft.json()['number']}", json=over)
        assert moved.status_code == 409, moved.text
        assert "hiddenproject" not in moved.text
    told = admin.post("/v1/datasets/wiki/versions", json=over)
    assert told.status_code == 409
    assert "'hiddenproject'" in told.json()["detail"]
