"""Hostile inputs get a 422 naming the field, never a 500, and nothing of them is stored.

Every test runs against a live uvicorn server on SQLite and on PostgreSQL. Bodies are sent
as raw JSON text, so escapes such as ``"\\ud800"`` reach the server exactly as an attacker
would write them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from shardstream.server.db import make_engine
from shardstream.wire import FieldLimits, set_field_limits
from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published, shard

KIB = 1024
LISTERS = 3
SOURCES = [{"dataset": "alpha", "version": 1}]


@pytest.fixture
def admin(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, headers=live.headers, timeout=60) as client:
        yield client


@pytest.fixture
def writer(live: LiveServer, admin: httpx.Client, tmp_path: Path) -> Iterator[httpx.Client]:
    """A write token on a server holding one published dataset, ``alpha``."""
    make_published(admin, "alpha", tmp_path / "alpha")
    r = admin.post("/v1/tokens", json={"name": "builder", "scopes": ["write"]})
    headers = {"Authorization": f"Bearer {r.json()['secret']}"}
    with httpx.Client(base_url=live.url, headers=headers, timeout=60) as client:
        yield client


def post_raw(client: httpx.Client, path: str, body: str | bytes) -> httpx.Response:
    data = body.encode() if isinstance(body, str) else body
    return client.post(path, content=data, headers={"content-type": "application/json"})


def refused(response: httpx.Response, field: str) -> str:
    """Assert a 422 whose message starts with ``field``; return the message."""
    assert response.status_code == 422, (field, response.status_code, response.text[:300])
    detail: str = response.json()["detail"]
    assert detail.startswith(field), (field, detail)
    return detail


def run_body(plan: str) -> str:
    return f'{{"sources": {json.dumps(SOURCES)}, "global_batch_size": 8, "plan": {plan}}}'


def nested(depth: int, leaf: str = "1") -> str:
    """A JSON object ``depth`` levels deep (the outermost counts as one)."""
    return '{"a":' * depth + leaf + "}" * depth


def test_oversized_documents_are_refused_and_not_stored(writer: httpx.Client) -> None:
    # The review's attack: runs with 20 MB plans (413 from the body limit in front).
    huge = writer.post(
        "/v1/runs",
        json={"sources": SOURCES, "global_batch_size": 8, "plan": {"blob": "x" * (20 << 20)}},
    )
    assert huge.status_code in (413, 422), huge.text[:300]
    # Below the body limit, the field limit names the field.
    big_plan = {"blob": "x" * (100 * KIB)}
    detail = refused(
        writer.post(
            "/v1/runs", json={"sources": SOURCES, "global_batch_size": 8, "plan": big_plan}
        ),
        "body.plan",
    )
    assert "65536 bytes" in detail
    many_keys = {f"k{i:06d}": i for i in range(10_000)}  # ~150 KiB of small entries
    refused(
        writer.post(
            "/v1/runs", json={"sources": SOURCES, "global_batch_size": 8, "plan": many_keys}
        ),
        "body.plan",
    )
    for field in ("builder_config", "lineage"):
        r = writer.post(
            "/v1/datasets/alpha/versions", json={"columns": {"x": "int"}, field: big_plan}
        )
        refused(r, f"body.{field}")
    refused(
        writer.post("/v1/datasets", json={"name": "d", "description": "x" * 20_000}),
        "body.description",
    )
    assert writer.get("/v1/runs").json()["items"] == []
    assert [v["number"] for v in writer.get("/v1/datasets/alpha/versions").json()["items"]] == [1]

    # A document just inside the limit is stored and read back whole.
    fits = {"blob": "y" * (60 * KIB)}
    run = writer.post("/v1/runs", json={"sources": SOURCES, "global_batch_size": 8, "plan": fits})
    assert run.status_code == 201, run.text[:300]
    url = f"/v1/runs/{run.json()['id']}/checkpoints"
    refused(
        writer.post(url, json={"step": 1, "epoch": 0, "sample_in_epoch": 0, "plan": big_plan}),
        "body.plan",
    )
    assert writer.get(url).json()["items"] == []
    assert writer.get(f"/v1/runs/{run.json()['id']}").json()["plan"] == fits


@pytest.mark.parametrize("depth", [33, 300, 1000, 5000, 100_000])
def test_deep_json_is_422_at_any_depth(writer: httpx.Client, depth: int) -> None:
    detail = refused(post_raw(writer, "/v1/runs", run_body(nested(depth))), "body")
    assert "deep" in detail
    arrays = "[" * depth + "]" * depth
    refused(post_raw(writer, "/v1/runs", run_body(f'{{"x": {arrays}}}')), "body")
    assert writer.get("/v1/runs").json()["items"] == []
    # The limit itself is usable: 32 levels are stored and returned intact.
    ok = post_raw(writer, "/v1/runs", run_body(nested(32)))
    assert ok.status_code == 201, ok.text[:300]
    assert json.dumps(ok.json()["plan"], separators=(",", ":")) == nested(32)


def test_bodies_the_json_parser_refuses_are_422(writer: httpx.Client) -> None:
    # FastAPI answers a bare 400 for what json.loads raises besides syntax errors.
    assert "UTF-8" in refused(post_raw(writer, "/v1/datasets", b'{"name": "\xff"}'), "body")
    digits = "9" * 5000  # beyond Python's int-from-text limit
    assert "digits" in refused(post_raw(writer, "/v1/runs", run_body(f'{{"n": {digits}}}')), "body")
    assert "JSON" in refused(post_raw(writer, "/v1/runs", "{"), "body")
    assert writer.get("/v1/runs").json()["items"] == []


def test_lone_surrogates_are_422_naming_the_field(
    admin: httpx.Client, writer: httpx.Client
) -> None:
    s = '"\\ud800"'  # a JSON escape that decodes to a lone UTF-16 surrogate
    cases = [
        ("/v1/datasets", f'{{"name": "d1", "description": {s}}}', "body.description"),
        ("/v1/runs", run_body(f'{{"x": {s}}}'), "body.plan"),
        ("/v1/runs", run_body(f"{{{s}: 1}}"), "body.plan"),
        ("/v1/runs", run_body(f'{{"x": [1, {{"y": {s}}}]}}'), "body.plan"),
        (
            "/v1/runs",
            f'{{"name": {s}, "sources": {json.dumps(SOURCES)}, "global_batch_size": 8}}',
            "body.name",
        ),
        ("/v1/datasets/alpha/versions", f'{{"columns": {{{s}: "int"}}}}', "body.columns"),
        ("/v1/datasets/alpha/versions", f'{{"columns": {{"x": {s}}}}}', "body.columns"),
        (
            "/v1/datasets/alpha/versions",
            f'{{"columns": {{"x": "int"}}, "builder_config": {{"a": {s}}}}}',
            "body.builder_config",
        ),
        ("/v1/tokens", f'{{"name": {s}, "scopes": ["read"]}}', "body.name"),
    ]
    for path, body, field in cases:
        client = admin if path == "/v1/tokens" else writer
        refused(post_raw(client, path, body), field)
    assert writer.get("/v1/runs").json()["items"] == []
    assert [d["name"] for d in writer.get("/v1/datasets").json()["items"]] == ["alpha"]
    assert [v["number"] for v in writer.get("/v1/datasets/alpha/versions").json()["items"]] == [1]
    draft = writer.post("/v1/datasets/alpha/versions", json={"columns": {"x": "int"}}).json()
    base = f"/v1/datasets/alpha/versions/{draft['number']}/shards"
    record = json.dumps(shard(0))[:-1] + f', "mds": {{"x": {s}}}}}'
    refused(post_raw(writer, base, f'{{"shards": [{record}]}}'), "body.shards[0].mds")
    hashes = json.dumps({**shard(0), "hashes": {"sha1": "\ud800"}})  # escaped as \\ud800
    refused(post_raw(writer, base, f'{{"shards": [{hashes}]}}'), "body.shards[0].hashes")
    assert writer.get(f"/v1/datasets/alpha/versions/{draft['number']}").json()["num_shards"] == 0


def test_nul_and_control_characters_in_names_and_columns(writer: httpx.Client) -> None:
    refused(writer.post("/v1/datasets", json={"name": "a\u0000"}), "body.name")
    for columns in ({"a\u0000b": "int"}, {"x": "int\u0000"}, {"a\nb": "int"}):
        refused(
            writer.post("/v1/datasets/alpha/versions", json={"columns": columns}), "body.columns"
        )
    refused(
        writer.post(
            "/v1/runs", json={"name": "r\u0000", "sources": SOURCES, "global_batch_size": 8}
        ),
        "body.name",
    )
    refused(
        writer.post(
            "/v1/runs", json={"sources": SOURCES, "global_batch_size": 8, "plan": {"k\u0000": 1}}
        ),
        "body.plan",
    )
    assert [v["number"] for v in writer.get("/v1/datasets/alpha/versions").json()["items"]] == [1]


def test_token_expiry_extremes(live: LiveServer, admin: httpx.Client) -> None:
    for bad in ["9999-12-31T23:59:59-05:00", "0001-01-01T00:30:00+01:00"]:
        r = admin.post("/v1/tokens", json={"name": "t", "scopes": ["read"], "expires_at": bad})
        detail = refused(r, "body.expires_at")
        assert "years 1-9999" in detail
    assert admin.get("/v1/tokens").json()["items"] == []

    def token(expires_at: str) -> dict[str, Any]:
        r = admin.post(
            "/v1/tokens", json={"name": "t", "scopes": ["read"], "expires_at": expires_at}
        )
        assert r.status_code == 201, r.text
        created: dict[str, Any] = r.json()
        return created

    def status(secret: str) -> int:
        headers = {"Authorization": f"Bearer {secret}"}
        return httpx.get(f"{live.url}/v1/whoami", headers=headers, timeout=30).status_code

    # The latest and earliest instants that exist in UTC are stored and enforced.
    latest = token("9999-12-31T23:59:59+00:00")
    assert latest["expires_at"] == "9999-12-31T23:59:59Z"
    assert status(latest["secret"]) == 200
    earliest = token("0001-01-01T01:30:00+01:00")
    assert earliest["expires_at"] == "0001-01-01T00:30:00Z"
    assert status(earliest["secret"]) == 401
    # No timezone means UTC, and the answer says so.
    assert token("2999-01-01T00:00:00")["expires_at"] == "2999-01-01T00:00:00Z"
    shifted = token("2999-01-01T00:00:00-05:00")
    assert shifted["expires_at"] == "2999-01-01T05:00:00Z"
    assert admin.get(f"/v1/tokens/{shifted['id']}").json()["expires_at"] == "2999-01-01T05:00:00Z"


def test_version_totals_beyond_int64_are_422(writer: httpx.Client) -> None:
    top = 2**62
    draft = writer.post("/v1/datasets/alpha/versions", json={"columns": {"x": "int"}}).json()
    url = f"/v1/datasets/alpha/versions/{draft['number']}"
    one_batch = [shard(i, samples=top) for i in range(3)]
    refused(writer.post(f"{url}/shards", json={"shards": one_batch}), "body.shards")
    first = writer.post(f"{url}/shards", json={"shards": [shard(0, samples=top)]})
    assert first.status_code == 200, first.text
    # Each batch fits; their sum would not: refused by the draft, which stays as it was.
    detail = refused(
        writer.post(f"{url}/shards", json={"shards": [shard(1, samples=top)]}), "body.shards"
    )
    assert "64-bit" in detail
    raw = shard(1, size=top)
    refused(
        writer.post(f"{url}/shards", json={"shards": [{**raw, "samples": 1}, shard(2, size=top)]}),
        "body.shards",
    )
    version = writer.get(url).json()
    assert (version["num_shards"], version["total_samples"]) == (1, top)


def test_json_limits_follow_the_settings(tmp_path: Path) -> None:
    """The limits are process-wide (the wire schema checks them): restore the defaults."""
    try:
        with start_server(
            tmp_path / "small",
            storage_roots=tmp_path.as_uri(),
            max_json_bytes=2048,
            max_json_depth=4,
        ) as server:
            api = httpx.Client(base_url=server.url, headers=server.headers, timeout=30)
            make_published(api, "alpha", tmp_path / "small" / "alpha")
            body = {"sources": SOURCES, "global_batch_size": 8}
            assert "2048 bytes" in refused(
                api.post("/v1/runs", json={**body, "plan": {"x": "y" * 3000}}), "body.plan"
            )
            assert "4 levels" in refused(
                post_raw(api, "/v1/runs", run_body(nested(5))), "body.plan"
            )
            assert api.post("/v1/runs", json={**body, "plan": {"x": "y" * 1500}}).status_code == 201
            assert post_raw(api, "/v1/runs", run_body(nested(4))).status_code == 201
    finally:
        set_field_limits(FieldLimits())


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_listing_runs_with_large_plans_keeps_memory_bounded(
    live: LiveServer, writer: httpx.Client
) -> None:
    """The review's 2.9 GB: many large plans listed by several clients at once.

    The server runs in this process (a uvicorn thread), so this process's RSS is the
    server's plus the clients'. Plans are made of many small entries, the costliest shape
    in memory once parsed.
    """
    plan = {f"k{i:05d}": i for i in range(4_000)}  # ~55 KiB, inside the limit
    assert len(json.dumps(plan, separators=(",", ":"))) < 64 * KIB
    runs = 200
    r = writer.post("/v1/runs", json={"sources": SOURCES, "global_batch_size": 8, "plan": plan})
    assert r.status_code == 201
    # The other runs are copies made in SQL (what 300 such POSTs would store, faster).
    engine = make_engine(live.database_url)
    with engine.begin() as conn:
        for _ in range(runs - 1):
            new_id = conn.execute(
                text(
                    "INSERT INTO runs (name, seed, global_batch_size, plan, status, created_by,"
                    " created_at, updated_at, owner) SELECT name, seed, global_batch_size, plan,"
                    " status, created_by, created_at, updated_at, owner FROM runs WHERE id = :id"
                    " RETURNING id"
                ),
                {"id": r.json()["id"]},
            ).scalar_one()
            conn.execute(
                text(
                    "INSERT INTO run_sources (run_id, position, dataset, version, version_id,"
                    " weight) SELECT :new, position, dataset, version, version_id, weight"
                    " FROM run_sources WHERE run_id = :id"
                ),
                {"new": new_id, "id": r.json()["id"]},
            )
    engine.dispose()
    first = writer.get("/v1/runs", params={"limit": 1000})
    page = first.json()
    # Effect of the page budget: the page ends early, well below the limit asked for.
    assert 0 < len(page["items"]) < runs and page["next_cursor"] is not None
    assert len(first.content) < 2 << 20

    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.005)

    def list_all(seen: list[int]) -> None:
        with httpx.Client(base_url=str(writer.base_url), headers=writer.headers, timeout=120) as c:
            cursor = None
            while True:
                params: dict[str, Any] = {"limit": 1000}
                if cursor:
                    params["cursor"] = cursor
                body = c.get("/v1/runs", params=params).json()
                seen.append(len(body["items"]))
                cursor = body["next_cursor"]
                if cursor is None:
                    return

    baseline = _rss_mib()
    sampler = threading.Thread(target=sample)
    sampler.start()
    counts: list[list[int]] = [[] for _ in range(LISTERS)]
    listers = [threading.Thread(target=list_all, args=(c,)) for c in counts]
    for t in listers:
        t.start()
    for t in listers:
        t.join()
    done.set()
    sampler.join()
    assert [sum(c) for c in counts] == [runs] * LISTERS  # every run listed, a page at a time
    grown = peak[0] - baseline
    print(f"RSS {baseline:.0f} MiB -> peak {peak[0]:.0f} MiB (+{grown:.0f}), {LISTERS} listers")
    assert grown < 180, f"RSS grew by {grown:.0f} MiB while listing runs"


def _pages(client: httpx.Client, url: str) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        body = client.get(url, params=params).json()
        pages.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def test_pages_of_large_documents_end_early_and_lose_nothing(writer: httpx.Client) -> None:
    doc = {"blob": "z" * (60 * KIB)}
    for _ in range(20):
        body = {"columns": {"x": "int"}, "builder_config": doc, "lineage": doc}
        assert writer.post("/v1/datasets/alpha/versions", json=body).status_code == 201
    pages = _pages(writer, "/v1/datasets/alpha/versions")
    assert len(pages) > 1 and all(len(p) < 21 for p in pages)
    assert [v["number"] for p in pages for v in p] == list(range(1, 22))
    run = writer.post("/v1/runs", json={"sources": SOURCES, "global_batch_size": 8}).json()
    url = f"/v1/runs/{run['id']}/checkpoints"
    for step in range(1, 31):
        state = {"step": step, "epoch": 0, "sample_in_epoch": step, "plan": doc}
        assert writer.post(url, json=state).status_code == 201
    pages = _pages(writer, url)
    assert len(pages) > 1 and all(0 < len(p) < 30 for p in pages)
    assert [c["step"] for p in pages for c in p] == list(range(1, 31))
