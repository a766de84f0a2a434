"""Tokens: scopes, dataset allow-lists, revocation, secrets stored only as hashes."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text

from tests.fixtures.server import LiveServer
from tests.server.conftest import make_published


def _client(app: FastAPI, secret: str | None) -> TestClient:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return TestClient(app, headers=headers)


def _token(api: TestClient, name: str, scopes: list[str], datasets: list[str] | None = None) -> str:
    r = api.post("/v1/tokens", json={"name": name, "scopes": scopes, "datasets": datasets})
    assert r.status_code == 201, r.text
    secret: str = r.json()["secret"]
    assert secret.startswith("ss_")
    return secret


def test_every_endpoint_but_health_needs_a_token(app: FastAPI) -> None:
    anon = _client(app, None)
    for path in ["/v1/datasets", "/v1/runs", "/v1/tokens", "/v1/whoami", "/v1/datasets/x"]:
        r = anon.get(path)
        assert r.status_code == 401, path
        assert "token" in r.json()["detail"]
    assert anon.get("/healthz").status_code == 200
    assert anon.get("/readyz").status_code == 200
    assert anon.get("/metrics").status_code == 200
    assert _client(app, "ss_wrong").get("/v1/datasets").status_code == 401
    basic = anon.get("/v1/datasets", headers={"Authorization": "Basic abc"})
    assert basic.status_code == 401


def test_scopes(api: TestClient, app: FastAPI, tmp_path: Path) -> None:
    make_published(api, "wiki", tmp_path / "w")
    reader = _client(app, _token(api, "reader", ["read"]))
    writer = _client(app, _token(api, "writer", ["write"]))
    assert reader.get("/v1/datasets/wiki").status_code == 200
    denied = reader.post("/v1/datasets", json={"name": "new"})
    assert denied.status_code == 403
    assert "write" in denied.json()["detail"]
    assert writer.post("/v1/datasets", json={"name": "new"}).status_code == 201
    assert writer.get("/v1/datasets/new").status_code == 200  # write includes read
    assert writer.post("/v1/tokens", json={"name": "x", "scopes": ["read"]}).status_code == 403
    assert reader.get("/v1/whoami").json()["scope"] == "read"


def test_dataset_allow_list(api: TestClient, app: FastAPI, tmp_path: Path) -> None:
    make_published(api, "open", tmp_path / "o")
    make_published(api, "secret", tmp_path / "s")
    limited = _client(app, _token(api, "limited", ["write"], datasets=["open"]))
    assert [d["name"] for d in limited.get("/v1/datasets").json()["items"]] == ["open"]
    assert limited.get("/v1/datasets/open/versions/1").status_code == 200
    r = limited.get("/v1/datasets/secret/versions/1")
    assert r.status_code == 403
    assert "secret" in r.json()["detail"]
    assert (
        limited.post(
            "/v1/datasets/secret/versions/1/presign", json={"keys": ["shard.00000.mds"]}
        ).status_code
        == 403
    )
    assert limited.post("/v1/datasets", json={"name": "other"}).status_code == 403
    run_secret = api.post(
        "/v1/runs", json={"sources": [{"dataset": "secret", "version": 1}], "global_batch_size": 2}
    ).json()
    run_open = limited.post(
        "/v1/runs", json={"sources": [{"dataset": "open", "version": 1}], "global_batch_size": 2}
    )
    assert run_open.status_code == 201
    assert (
        limited.post(
            "/v1/runs",
            json={"sources": [{"dataset": "secret", "version": 1}], "global_batch_size": 2},
        ).status_code
        == 403
    )
    assert limited.get(f"/v1/runs/{run_secret['id']}").status_code == 403
    for figures in ("mixture", "input-stats"):  # a run's figures are the run's
        assert limited.get(f"/v1/runs/{run_secret['id']}/{figures}").status_code == 403
        assert limited.get(f"/v1/runs/{run_open.json()['id']}/{figures}").status_code == 200
    assert [r["id"] for r in limited.get("/v1/runs").json()["items"]] == [run_open.json()["id"]]


def test_revoke_and_secret_is_only_a_hash(api: TestClient, app: FastAPI) -> None:
    r = api.post("/v1/tokens", json={"name": "temp", "scopes": ["read"]})
    token = r.json()
    client = _client(app, token["secret"])
    assert client.get("/v1/datasets").status_code == 200
    listed = api.get("/v1/tokens").json()["items"]
    assert [t["secret"] for t in listed] == [None]
    assert api.get(f"/v1/tokens/{token['id']}").json()["secret"] is None
    with app.state.engine.connect() as conn:
        stored = conn.execute(text("SELECT secret_hash FROM tokens")).scalars().all()
    assert stored == [hashlib.sha256(token["secret"].encode()).hexdigest()]
    assert api.delete(f"/v1/tokens/{token['id']}").json()["revoked_at"] is not None
    revoked = client.get("/v1/datasets")
    assert revoked.status_code == 401
    assert "revoked" in revoked.json()["detail"]
    assert api.delete("/v1/tokens/999").status_code == 404


def test_expired_token(api: TestClient, app: FastAPI) -> None:
    r = api.post(
        "/v1/tokens", json={"name": "old", "scopes": ["read"], "expires_at": "2001-01-01T00:00:00Z"}
    )
    expired = _client(app, r.json()["secret"]).get("/v1/datasets")
    assert expired.status_code == 401
    assert "expired" in expired.json()["detail"]


def test_invalid_token_requests(api: TestClient) -> None:
    assert api.post("/v1/tokens", json={"name": "x", "scopes": ["root"]}).status_code == 422
    assert api.post("/v1/tokens", json={"name": "x", "scopes": []}).status_code == 422
    assert (
        api.post(
            "/v1/tokens", json={"name": "x", "scopes": ["read"], "datasets": ["BAD"]}
        ).status_code
        == 422
    )


# --- least privilege (live server): a token mints, sees and revokes only within its rights


def _live_client(live: LiveServer, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
    )


def _mint(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/tokens", json={"name": "minted", "scopes": ["read"], **body})


def test_a_restricted_admin_cannot_mint_beyond_its_rights(live: LiveServer, tmp_path: Path) -> None:
    boot = _live_client(live, live.token)
    make_published(boot, "alpha", tmp_path / "alpha")
    make_published(boot, "beta", tmp_path / "beta")
    soon = (datetime.now(timezone.utc) + timedelta(days=1)).replace(microsecond=0)
    r = _mint(
        boot, name="alpha-admin", scopes=["admin"], datasets=["alpha"], expires_at=soon.isoformat()
    )
    alpha_admin = _live_client(live, r.json()["secret"])

    # The review's escalation (an unrestricted admin), and its variations: all 403.
    for body in [
        {"scopes": ["admin"]},
        {"scopes": ["read"], "expires_at": soon.isoformat()},
        {"scopes": ["admin"], "datasets": ["alpha", "beta"], "expires_at": soon.isoformat()},
        {"scopes": ["read"], "datasets": ["beta"], "expires_at": soon.isoformat()},
        {"scopes": ["read"], "datasets": ["alpha"]},  # outlives its minter
        {
            "scopes": ["read"],
            "datasets": ["alpha"],
            "expires_at": (soon + timedelta(seconds=1)).isoformat(),
        },
    ]:
        refused = _mint(alpha_admin, **body)
        assert refused.status_code == 403, (body, refused.text)
        assert "alpha-admin" in refused.json()["detail"]
    assert [t["name"] for t in boot.get("/v1/tokens").json()["items"]] == ["alpha-admin"]

    # Within its rights it may mint, and what it mints reaches alpha only.
    ok = _mint(alpha_admin, scopes=["admin"], datasets=["alpha"], expires_at=soon.isoformat())
    assert ok.status_code == 201, ok.text
    assert ok.json()["datasets"] == ["alpha"]
    minted = _live_client(live, ok.json()["secret"])
    assert minted.get("/v1/datasets/alpha").status_code == 200
    assert minted.get("/v1/datasets/beta").status_code == 403
    assert [d["name"] for d in minted.get("/v1/datasets").json()["items"]] == ["alpha"]
    presign = minted.post(
        "/v1/datasets/beta/versions/1/presign", json={"keys": ["shard.00000.mds"]}
    )
    assert presign.status_code == 403
    assert "urls" not in presign.json()
    # ...and it cannot escalate in turn either.
    assert _mint(minted, scopes=["admin"], expires_at=soon.isoformat()).status_code == 403

    # A writer mints nothing; an unrestricted admin mints anything.
    writer = _live_client(live, _mint(boot, name="w", scopes=["write"]).json()["secret"])
    assert _mint(writer, scopes=["read"], datasets=["alpha"]).status_code == 403
    assert _mint(boot, scopes=["admin"]).status_code == 201


def test_a_restricted_admin_sees_and_revokes_only_tokens_within_its_rights(
    live: LiveServer, tmp_path: Path
) -> None:
    boot = _live_client(live, live.token)
    make_published(boot, "alpha", tmp_path / "alpha")
    make_published(boot, "beta", tmp_path / "beta")
    alpha_admin_t = _mint(boot, name="alpha-admin", scopes=["admin"], datasets=["alpha"]).json()
    beta_reader = _mint(boot, name="beta-reader", datasets=["beta"]).json()
    root = _mint(boot, name="root", scopes=["admin"]).json()
    alpha_reader = _mint(boot, name="alpha-reader", datasets=["alpha"]).json()
    alpha_admin = _live_client(live, alpha_admin_t["secret"])

    listed = alpha_admin.get("/v1/tokens", params={"limit": 1})
    names = []
    page = listed.json()
    while True:
        names += [t["name"] for t in page["items"]]
        if page["next_cursor"] is None:
            break
        page = alpha_admin.get(
            "/v1/tokens", params={"cursor": page["next_cursor"], "limit": 1}
        ).json()
    assert names == ["alpha-admin", "alpha-reader"]
    for other in (beta_reader, root):
        assert alpha_admin.get(f"/v1/tokens/{other['id']}").status_code == 404
        assert alpha_admin.delete(f"/v1/tokens/{other['id']}").status_code == 404
    # Effect: the other teams' tokens still work.
    assert _live_client(live, beta_reader["secret"]).get("/v1/datasets/beta").status_code == 200
    assert _live_client(live, root["secret"]).get("/v1/tokens").status_code == 200
    # Its own team's token it can revoke, and that token stops working.
    assert alpha_admin.delete(f"/v1/tokens/{alpha_reader['id']}").json()["revoked_at"]
    assert _live_client(live, alpha_reader["secret"]).get("/v1/datasets").status_code == 401
