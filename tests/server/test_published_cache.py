"""Published versions served from memory (``server/cache/published.py``).

Real apps on both databases: queries are counted with a SQLAlchemy cursor event on the
app's engine, concurrency comes from ``asyncio.gather`` over the ASGI app, and a second
app on the same database plays another replica. Covered: single flight (one query for a
cold burst; cancellation and errors of waiters), no query on the hot path, the snapshot
TTL and deletions, drafts, presigned-URL reuse, and the page cache's byte bound.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import hypothesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import strategies as st

from shardstream.server.app import create_app
from shardstream.server.cache.published import ByteCache
from shardstream.server.cache.singleflight import SingleFlight
from shardstream.server.config import Settings
from tests.fixtures.query_log import count_queries
from tests.fixtures.s3 import S3Bucket
from tests.server.conftest import ADMIN, make_published, shard

AUTH = {"Authorization": f"Bearer {ADMIN}"}
BURST = 50


# --- helpers -------------------------------------------------------------------------


@contextmanager
def replica(settings: Settings, **overrides: Any) -> Iterator[tuple[FastAPI, TestClient]]:
    """Another app on the same database (another server process), with ``overrides``."""
    app = create_app(settings.model_copy(update=overrides))
    try:
        with TestClient(app, headers=AUTH) as client:
            yield app, client
    finally:
        app.state.engine.dispose()


def burst(app: FastAPI, paths: list[str]) -> list[httpx.Response]:
    """GET every path concurrently on one event loop, straight into the ASGI app."""

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=AUTH
        ) as client:
            return list(await asyncio.gather(*(client.get(p) for p in paths)))

    return asyncio.run(run())


def expiry(value: str) -> float:
    """A PresignResponse ``expires_at`` as epoch seconds."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def s3_url_expiry(url: str) -> float:
    """When a presigned S3 URL stops working (SigV4 or SigV2 query string)."""
    query = {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}
    if "X-Amz-Date" in query:
        signed = datetime.strptime(query["X-Amz-Date"] + "+0000", "%Y%m%dT%H%M%SZ%z")
        return signed.timestamp() + int(query["X-Amz-Expires"])
    return float(query["Expires"])


# --- single flight -------------------------------------------------------------------


def test_a_cold_burst_is_one_version_query_and_one_page_query(
    app: FastAPI, api: TestClient, tmp_path: Path
) -> None:
    """50 version GETs and 50 shard-page GETs at once on a cold replica: two queries."""
    v = make_published(api, "cold", tmp_path / "cold", shards=4)
    base = f"/v1/datasets/cold/versions/{v['number']}"
    # Nothing cached yet; one token sends the whole burst, beyond the per-token bound on
    # requests in flight (server/budget.py), which is not what this test is about.
    cold = create_app(app.state.settings.model_copy(update={"token_concurrency": 0}))
    try:
        with count_queries(cold, delay_s=0.05) as log:
            responses = burst(cold, [base] * BURST + [f"{base}/shards?limit=3"] * BURST)
    finally:
        cold.state.engine.dispose()
    assert [r.status_code for r in responses] == [200] * (2 * BURST)
    assert {r.content for r in responses[:BURST]} == {api.get(base).content}
    assert {r.content for r in responses[BURST:]} == {api.get(f"{base}/shards?limit=3").content}
    assert (log.versions, log.shards) == (1, 1)


def test_single_flight_holds_without_any_cache(
    settings: Settings, api: TestClient, tmp_path: Path
) -> None:
    """With the snapshot cache off (TTL 0), a burst still shares one load; one by one,
    every request loads again."""
    v = make_published(api, "nocache", tmp_path / "nocache")
    path = f"/v1/datasets/nocache/versions/{v['number']}"
    # Read slots off: 16 slots would let the burst of 50 in as ~4 flights, one after another.
    with replica(settings, version_cache_s=0, read_slots=0) as (app, client):
        with count_queries(app, delay_s=0.1) as log:
            assert {r.status_code for r in burst(app, [path] * BURST)} == {200}
        assert log.versions == 1
        with count_queries(app) as log:
            for _ in range(3):
                assert client.get(path).status_code == 200
        assert log.versions == 3


def test_single_flight_shares_one_load_and_forgets_it_when_done() -> None:
    """Concurrent callers get the one result; a later call loads afresh."""
    flight: SingleFlight[str, int] = SingleFlight()
    loads = 0

    async def main() -> None:
        nonlocal loads
        gate = asyncio.Event()

        async def load() -> int:
            nonlocal loads
            loads += 1
            await gate.wait()
            return loads

        waiters = [asyncio.ensure_future(flight.run("k", load)) for _ in range(10)]
        await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*waiters) == [1] * 10
        assert await flight.run("k", load) == 2  # a result is shared, never kept

    asyncio.run(main())
    assert loads == 2


def test_a_cancelled_waiter_leaves_the_load_to_the_others() -> None:
    """A client that goes away cancels its own wait, not the load the others share."""
    flight: SingleFlight[str, str] = SingleFlight()
    finished: list[str] = []

    async def main() -> None:
        gate = asyncio.Event()

        async def load() -> str:
            await gate.wait()
            finished.append("load")
            return "snapshot"

        first, *others = [asyncio.ensure_future(flight.run("k", load)) for _ in range(3)]
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*others) == ["snapshot", "snapshot"]
        assert first.cancelled()

    asyncio.run(main())
    assert finished == ["load"]


def test_a_failed_load_reaches_every_waiter_and_is_not_kept() -> None:
    """Every waiter sees the load's exception; the next call tries again."""
    flight: SingleFlight[str, int] = SingleFlight()
    calls = 0

    async def main() -> None:
        gate = asyncio.Event()

        async def failing() -> int:
            nonlocal calls
            calls += 1
            await gate.wait()
            raise LookupError("dataset 'x' not found")

        waiters = [asyncio.ensure_future(flight.run("k", failing)) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, LookupError) for r in results), results

        async def recovered() -> int:
            return 7

        assert await flight.run("k", recovered) == 7

    asyncio.run(main())
    assert calls == 1


# --- the hot path ---------------------------------------------------------------------


def test_published_reads_cost_no_query_after_the_first(
    app: FastAPI, api: TestClient, tmp_path: Path
) -> None:
    """Versions and every shard page come from memory, byte for byte; 304 still works."""
    v = make_published(api, "hot", tmp_path / "hot", shards=5)
    base = f"/v1/datasets/hot/versions/{v['number']}"
    pages = [f"{base}/shards?limit=2", f"{base}/shards?limit=2&cursor=2"]
    first = {path: api.get(path) for path in [base, *pages]}
    assert first[pages[0]].json()["next_cursor"] == "2"
    with count_queries(app) as log:
        for _ in range(5):
            for path, response in first.items():
                again = api.get(path)
                assert again.status_code == 200
                assert again.content == response.content
                assert again.headers["etag"] == response.headers["etag"]
        for path, response in first.items():
            etag = response.headers["etag"]
            cached = api.get(path, headers={"If-None-Match": etag})
            assert (cached.status_code, cached.content) == (304, b"")
            assert cached.headers["etag"] == etag
    assert (log.versions, log.shards) == (0, 0)


# --- the TTL and deletions --------------------------------------------------------------


def test_a_deletion_through_another_replica_is_seen_after_the_ttl(
    settings: Settings, api: TestClient, tmp_path: Path
) -> None:
    """A replica serves a version it holds until its TTL passes, then answers 404. (The
    TTL is long enough for a delete and four reads on a loaded machine: at 1 s, CI's
    PostgreSQL run once took longer than the window it observes.)"""
    ttl = 3.0
    v = make_published(api, "gone", tmp_path / "gone")
    base = f"/v1/datasets/gone/versions/{v['number']}"
    with replica(settings, version_cache_s=ttl) as (_, stale):
        before = time.monotonic()
        assert stale.get(base).status_code == 200  # the snapshot is stamped in here
        after = time.monotonic()
        assert stale.get(f"{base}/shards").status_code == 200
        assert api.delete("/v1/datasets/gone").status_code == 204
        assert api.get(base).status_code == 404  # the deleting replica knows at once
        still = [stale.get(base).status_code, stale.get(f"{base}/shards").status_code]
        assert time.monotonic() - before < ttl, "too slow to observe the TTL window"
        assert still == [200, 200]
        time.sleep(max(0.0, after + ttl + 0.05 - time.monotonic()))
        assert stale.get(base).status_code == 404
        assert stale.get(f"{base}/shards").status_code == 404


def test_a_deletion_through_this_replica_is_seen_at_once(
    app: FastAPI, api: TestClient, tmp_path: Path
) -> None:
    """Deleting the dataset here drops its snapshots (the TTL is 5 s)."""
    assert app.state.settings.version_cache_s >= 5
    v = make_published(api, "here", tmp_path / "here")
    base = f"/v1/datasets/here/versions/{v['number']}"
    keys = {"keys": ["shard.00000.mds"]}
    assert api.get(base).status_code == 200
    assert api.get(f"{base}/shards").status_code == 200
    assert api.post(f"{base}/presign", json=keys).status_code == 200
    assert api.delete("/v1/datasets/here").status_code == 204
    assert api.get(base).status_code == 404
    assert api.get(f"{base}/shards").status_code == 404
    assert api.post(f"{base}/presign", json=keys).status_code == 404


def test_drafts_are_never_cached(app: FastAPI, api: TestClient, tmp_path: Path) -> None:
    """A draft is read from the database every time and published the moment it is."""
    root = tmp_path / "draft"
    root.mkdir()
    (root / "shard.00000.mds").write_bytes(b"x" * 10)
    assert api.post("/v1/datasets", json={"name": "draft"}).status_code == 201
    v = api.post(
        "/v1/datasets/draft/versions", json={"columns": {}, "storage_root": root.as_uri()}
    ).json()
    base = f"/v1/datasets/draft/versions/{v['number']}"
    assert api.post(f"{base}/shards", json={"shards": [shard(0)]}).status_code == 200
    with count_queries(app) as log:
        for path in [base, base, f"{base}/shards", f"{base}/shards"]:
            draft = api.get(path)
            assert draft.status_code == 200
            assert draft.headers["cache-control"] == "no-store"
            assert "etag" not in draft.headers
    assert (log.versions, log.shards) == (4, 2)
    assert api.get(base).json()["status"] == "draft"
    assert api.post(f"{base}/publish").status_code == 200
    published = api.get(base)
    assert published.json()["status"] == "published"
    assert published.headers["etag"].startswith('"v')
    assert "immutable" in published.headers["cache-control"]


# --- presigned URLs ---------------------------------------------------------------------


def test_presigned_urls_are_reused_without_a_query(
    app: FastAPI, api: TestClient, tmp_path: Path
) -> None:
    """A second presign of the same keys reuses the signed URLs and queries nothing."""
    v = make_published(api, "urls", tmp_path / "urls", shards=3)
    url = f"/v1/datasets/urls/versions/{v['number']}/presign"
    keys = {"keys": ["shard.00000.mds", "shard.00002.mds"], "expires_s": 600}
    first = api.post(url, json=keys)
    assert first.status_code == 200, first.text
    time.sleep(1.01 - time.time() % 1)  # into the next second: a new signature ends later
    asked = time.time()
    with count_queries(app) as log:
        second = api.post(url, json=keys)
    assert second.status_code == 200
    assert second.json()["urls"] == first.json()["urls"]
    assert (log.versions, log.shards) == (0, 0)
    # URLs signed now would run until math.floor(asked) + 600 at least.
    assert expiry(second.json()["expires_at"]) < math.floor(asked) + 600


def test_an_unknown_key_is_404_among_cached_ones(api: TestClient, tmp_path: Path) -> None:
    """Cached keys never vouch for a key that is not part of the version."""
    v = make_published(api, "unknown", tmp_path / "unknown", shards=2)
    url = f"/v1/datasets/unknown/versions/{v['number']}/presign"
    assert api.post(url, json={"keys": ["shard.00000.mds", "shard.00001.mds"]}).status_code == 200
    for keys in (["nope.mds"], ["shard.00000.mds", "nope.mds", "shard.00001.mds"]):
        refused = api.post(url, json={"keys": keys})
        assert refused.status_code == 404
        assert "nope.mds" in refused.json()["detail"]


def test_a_reused_version_id_gets_its_own_keys_and_urls(
    settings: Settings, api: TestClient, tmp_path: Path
) -> None:
    """A version of a deleted dataset never answers for a newer one with the same row id
    (SQLite hands a deleted row's id out again)."""
    old = make_published(api, "old", tmp_path / "old", shards=3)
    old_url = f"/v1/datasets/old/versions/{old['number']}/presign"
    every = {"keys": ["shard.00000.mds", "shard.00002.mds"]}
    assert api.post(old_url, json=every).status_code == 200
    assert api.delete("/v1/datasets/old").status_code == 204
    new = make_published(api, "new", tmp_path / "new", shards=1)
    if settings.is_sqlite:
        assert new["id"] == old["id"]  # the case this test is about
    new_url = f"/v1/datasets/new/versions/{new['number']}/presign"
    r = api.post(new_url, json={"keys": ["shard.00000.mds"]})
    assert r.status_code == 200, r.text
    assert Path(urlparse(r.json()["urls"]["shard.00000.mds"]).path) == (
        tmp_path / "new" / "shard.00000.mds"
    )
    assert api.post(new_url, json=every).status_code == 404  # shard 2 was the old one's


def test_presigned_s3_urls_are_reused_while_half_their_lifetime_is_left(
    api: TestClient, s3_bucket: S3Bucket
) -> None:
    """Real signatures: reused within the window (same URL a second later), re-signed for
    a longer lifetime; ``expires_at`` is never later than a URL's own expiry."""
    client = s3_bucket.client()
    keys = [f"v1/shard.{i:05d}.mds" for i in range(2)]
    for key in keys:
        client.put_object(Bucket=s3_bucket.name, Key=key, Body=b"x" * 10)
    assert api.post("/v1/datasets", json={"name": "s3c"}).status_code == 201
    v = api.post(
        "/v1/datasets/s3c/versions", json={"columns": {}, "storage_root": f"{s3_bucket.url}/v1"}
    ).json()
    base = f"/v1/datasets/s3c/versions/{v['number']}"
    assert api.post(f"{base}/shards", json={"shards": [shard(0), shard(1)]}).status_code == 200
    assert api.post(f"{base}/publish").status_code == 200

    def presign(key: str, expires_s: int) -> tuple[str, float, float]:
        asked = time.time()
        r = api.post(f"{base}/presign", json={"keys": [key], "expires_s": expires_s})
        assert r.status_code == 200, r.text
        body = r.json()
        url = body["urls"][key]
        assert httpx.get(url).content == b"x" * 10
        at = expiry(body["expires_at"])
        assert asked + expires_s / 2 <= at <= s3_url_expiry(url), (at, s3_url_expiry(url))
        return url, at, asked

    first, _, _ = presign("shard.00000.mds", 3600)
    time.sleep(1.1)  # a fresh signature would carry another X-Amz-Date
    assert presign("shard.00000.mds", 3600)[0] == first
    # 3599 s left, 600 asked: that URL would outlive the lifetime asked, so a new one
    shorter, at, asked = presign("shard.00000.mds", 600)
    assert shorter != first and s3_url_expiry(shorter) <= asked + 600

    short, _, _ = presign("shard.00001.mds", 60)
    longer, at, asked = presign("shard.00001.mds", 3600)  # 60 s left < half of 3600
    assert longer != short
    assert at >= asked + 3600 - 1


# --- the page cache's bound --------------------------------------------------------------


@hypothesis.settings(
    max_examples=200, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    max_bytes=st.integers(min_value=4, max_value=4096),
    percents=st.lists(st.integers(0, 30), min_size=16, max_size=16),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 15)), min_size=10, max_size=200),
)
def test_the_page_cache_never_holds_more_than_its_bound(
    max_bytes: int, percents: list[int], ops: list[tuple[bool, int]]
) -> None:
    """Whatever is put and read, the bodies it still returns fit in ``max_bytes``; a body
    over a quarter of it is never kept, and a kept body comes back unchanged."""
    cache = ByteCache(max_bytes)
    # Sizes in percent of the bound: most bodies fit, some are over a quarter of it.
    bodies = {f'"v1.1-{n}"': bytes([n]) * (max_bytes * p // 100) for n, p in enumerate(percents)}
    for put, n in ops:
        key = f'"v1.1-{n}"'
        if put:
            cache.put(key, bodies[key])
            if len(bodies[key]) > max_bytes // 4:
                assert cache.get(key) is None
            else:
                assert cache.get(key) == bodies[key]  # just put: the newest entry
        held = {k: cache.get(k) for k in bodies}
        assert sum(len(b) for b in held.values() if b is not None) <= max_bytes
        assert all(b is None or b == bodies[k] for k, b in held.items())


def test_the_page_cache_evicts_the_least_recently_used() -> None:
    """A page read recently outlives one that was not; oversized pages are not kept."""
    cache = ByteCache(max_bytes=100)
    cache.put("a", b"a" * 25)
    cache.put("b", b"b" * 25)
    cache.put("c", b"c" * 25)
    cache.put("d", b"d" * 25)
    assert cache.get("a") == b"a" * 25  # now the most recently used
    cache.put("e", b"e" * 25)
    assert cache.get("b") is None
    assert [cache.get(k) is not None for k in "acde"] == [True] * 4
    cache.put("huge", b"h" * 26)
    assert cache.get("huge") is None
