"""The web console over HTTP: sign-in, the session cookie, CSRF, rights, paging, bounds.

Every test runs on SQLite and PostgreSQL (the ``api`` fixture). The browser tests are in
test_console_browser.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardstream.server.app import create_app
from shardstream.server.config import Settings
from tests.fixtures.console import browser, csrf_of, mint, run_with_checkpoints, sign_in
from tests.server.conftest import ADMIN, make_published


def test_sign_in_sets_a_strict_http_only_cookie_for_the_console_only(
    api: TestClient, app: FastAPI
) -> None:
    client = browser(app)
    done = client.post("/ui/login", data={"token": ADMIN, "next": "/ui/datasets"})
    assert done.status_code == 303
    cookie = done.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert "secure" not in cookie  # plain http here; behind TLS it is set:
    tls = browser(app).post(
        "/ui/login", data={"token": ADMIN}, headers={"X-Forwarded-Proto": "https"}
    )
    assert "secure" in tls.headers["set-cookie"].lower()
    assert client.get("/ui/datasets").status_code == 200
    # The JSON API never takes the cookie: bearer tokens only (no CSRF surface there).
    api_call = browser(app)
    api_call.cookies.set("shardstream_console", ADMIN)
    assert api_call.get("/v1/datasets").status_code == 401


def test_wrong_tokens_and_missing_sessions_go_to_sign_in(api: TestClient, app: FastAPI) -> None:
    client = browser(app)
    page = client.get("/ui/runs/7?x=1")
    assert page.status_code == 303
    assert page.headers["location"] == "/ui/login?next=%2Fui%2Fruns%2F7%3Fx%3D1"
    bad = client.post("/ui/login", data={"token": "ss_not_a_token"})
    assert bad.status_code == 401 and "does not know that token" in bad.text.lower()
    assert "set-cookie" not in bad.headers
    # After sign-in only console pages are followed: no open redirect.
    away = client.post("/ui/login", data={"token": ADMIN, "next": "https://evil.example/"})
    assert away.headers["location"] == "/ui/datasets"


def test_forms_without_this_sessions_csrf_token_are_refused(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, ADMIN)
    tokens_page = client.get("/ui/tokens")
    assert tokens_page.status_code == 200
    csrf = csrf_of(tokens_page.text)
    form = {"name": "ci", "scope": "read", "datasets": "", "expires_days": ""}
    assert client.post("/ui/tokens", data=form).status_code == 403
    assert client.post("/ui/tokens", data={**form, "csrf": "0" * 64}).status_code == 403
    other = sign_in(app, mint(api, "other-admin", ["admin"]))
    assert other.post("/ui/tokens", data={**form, "csrf": csrf}).status_code == 403
    cross = client.post(
        "/ui/tokens", data={**form, "csrf": csrf}, headers={"Origin": "https://evil.example"}
    )
    assert cross.status_code == 403
    fetched = client.post(
        "/ui/tokens", data={**form, "csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert fetched.status_code == 403
    made = client.post("/ui/tokens", data={**form, "csrf": csrf})
    assert made.status_code == 200
    secret = re.search(r'id="new-secret">(ss_[\w-]+)<', made.text)
    assert secret, made.text
    assert browser(app).post("/ui/login", data={"token": secret.group(1)}).status_code == 303
    assert [t["name"] for t in api.get("/v1/tokens").json()["items"]].count("ci") == 1


def test_a_bad_token_form_names_the_field(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, ADMIN)
    csrf = csrf_of(client.get("/ui/tokens").text)
    bad = client.post(
        "/ui/tokens", data={"csrf": csrf, "name": "x", "scope": "read", "expires_days": "soon"}
    )
    assert bad.status_code == 422 and "expires in days" in bad.text
    bad = client.post("/ui/tokens", data={"csrf": csrf, "name": "", "scope": "read"})
    assert bad.status_code == 422 and "name" in bad.text


def test_revoking_a_token_ends_its_session_at_once(api: TestClient, app: FastAPI) -> None:
    secret = mint(api, "reader", ["read"])
    session = sign_in(app, secret)
    assert session.get("/ui/datasets").status_code == 200
    admin = sign_in(app, ADMIN)
    page = admin.get("/ui/tokens").text
    token_id = next(t["id"] for t in api.get("/v1/tokens").json()["items"] if t["name"] == "reader")
    revoked = admin.post(f"/ui/tokens/{token_id}/revoke", data={"csrf": csrf_of(page)})
    assert revoked.status_code == 303
    after = session.get("/ui/datasets")
    assert after.status_code == 303 and after.headers["location"].startswith("/ui/login")
    assert 'shardstream_console=""' in after.headers["set-cookie"]  # the dead cookie dropped


def test_a_read_token_sees_no_admin_page(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, mint(api, "reader", ["read"]))
    runs = client.get("/ui/runs")
    assert runs.status_code == 200 and 'id="nav-tokens"' not in runs.text
    denied = client.get("/ui/tokens")
    assert denied.status_code == 403 and "needs &#39;admin&#39;" in denied.text
    csrf = csrf_of(runs.text)
    assert client.post("/ui/tokens", data={"csrf": csrf, "name": "x"}).status_code == 403


def test_what_a_token_cannot_read_does_not_appear(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    visible = run_with_checkpoints(api, tmp_path, "public-set")
    hidden = run_with_checkpoints(api, tmp_path, "secret-set")
    client = sign_in(app, mint(api, "narrow", ["read"], ["public-set"]))
    listing = client.get("/ui/datasets").text
    assert "public-set" in listing and "secret-set" not in listing
    runs = client.get("/ui/runs").text
    assert f'id="run-{visible}"' in runs and f'id="run-{hidden}"' not in runs
    assert client.get(f"/ui/runs/{hidden}").status_code == 403
    assert client.get("/ui/datasets/secret-set").status_code == 403
    assert client.get("/ui/datasets/secret-set/1").status_code == 403
    assert client.get("/ui/datasets/public-set/1").status_code == 200


def test_run_page_shows_progress_resumes_and_world_size_changes(
    api: TestClient, app: FastAPI, tmp_path: Path
) -> None:
    run_id = run_with_checkpoints(api, tmp_path)
    client = sign_in(app, ADMIN)
    page = client.get(f"/ui/runs/{run_id}").text
    assert 'id="samples-consumed">9<' in page  # 3 shards x 3 samples: epoch 0, sample 9
    assert "100.0%" in page
    assert page.count('class="point"') == 3
    assert "4 ranks" in page and "resumed" in page
    assert 'id="checkpoint-3"' in page
    commit = {"step": 4, "epoch": 1, "sample_in_epoch": 3, "plan": {"world_size": 4}}
    assert api.post(f"/v1/runs/{run_id}/checkpoints", json=commit).status_code == 201
    page = client.get(f"/ui/runs/{run_id}").text
    assert 'id="checkpoint-4"' in page and 'id="samples-consumed">12<' in page
    listing = client.get("/ui/runs").text
    assert f'id="run-{run_id}"' in listing and "epoch 1" in listing


def test_shard_table_pages_and_sorts(api: TestClient, app: FastAPI, tmp_path: Path) -> None:
    make_published(api, "big", tmp_path / "big", shards=150)
    client = sign_in(app, ADMIN)
    first = client.get("/ui/datasets/big/1").text
    assert first.count("<code>shard.") == 100 and "Page 1 of 2" in first
    second = client.get("/ui/datasets/big/1?page=2").text
    assert second.count("<code>shard.") == 50 and "shard.00149.mds" in second
    desc = client.get("/ui/datasets/big/1?sort=idx&order=desc").text
    assert desc.index("shard.00149.mds") < desc.index("shard.00148.mds")
    assert client.get("/ui/datasets/big/1?sort=key;drop").status_code == 422


def test_sign_in_bodies_are_bounded_before_any_token(api: TestClient, app: FastAPI) -> None:
    client = browser(app)
    huge = client.post(
        "/ui/login",
        content=b"token=" + b"a" * (70 << 10),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413
    other = client.post("/ui/tokens", data={"name": "x"})  # any other form needs a session
    assert other.status_code == 401


@pytest.mark.parametrize("path", ["/ui/datasets/nope", "/ui/datasets/nope/3", "/ui/runs/999"])
def test_unknown_things_are_404_pages(api: TestClient, app: FastAPI, path: str) -> None:
    page = sign_in(app, ADMIN).get(path)
    assert page.status_code == 404 and "not found" in page.text.lower()


def test_a_replay_by_another_rank_differs_only_in_its_session(
    api: TestClient, tmp_path: Path
) -> None:
    run_id = run_with_checkpoints(api, tmp_path)
    url = f"/v1/runs/{run_id}/checkpoints"
    same = {"step": 3, "epoch": 0, "sample_in_epoch": 9, "plan": {"world_size": 4, "session": "z"}}
    assert api.post(url, json=same).status_code == 200
    other = {**same, "plan": {"world_size": 8, "session": "b"}}
    assert api.post(url, json=other).status_code == 409


def test_the_console_can_be_turned_off(settings: Settings) -> None:
    off = create_app(settings.model_copy(update={"console": False}))
    try:
        with TestClient(off) as client:
            assert client.get("/ui/login").status_code == 404
            assert client.post("/ui/login", data={"token": ADMIN}).status_code == 404
            api = client.get("/v1/datasets", headers={"Authorization": f"Bearer {ADMIN}"})
            assert api.status_code == 200
    finally:
        off.state.engine.dispose()


@pytest.mark.parametrize("origin", ["null", "NULL", "https://evil.example"])
def test_sign_in_from_an_opaque_or_other_origin_is_refused(
    api: TestClient, app: FastAPI, origin: str
) -> None:
    """``Origin: null`` is what a sandboxed frame, a ``data:`` page or a file sends: a
    cross-site post that a real sign-in form on this site never makes (the console's
    ``Referrer-Policy: same-origin`` keeps browsers sending the real origin)."""
    client = browser(app)
    refused = client.post("/ui/login", data={"token": ADMIN}, headers={"Origin": origin})
    assert refused.status_code == 403 and "set-cookie" not in refused.headers
    assert "origin" in refused.json()["detail"]
    signed = sign_in(app, ADMIN)
    csrf = csrf_of(signed.get("/ui/datasets").text)
    out = signed.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": origin})
    assert out.status_code == 403
    assert signed.get("/ui/datasets").status_code == 200  # still signed in
    same = client.post("/ui/login", data={"token": ADMIN}, headers={"Origin": "http://testserver"})
    assert same.status_code == 303
