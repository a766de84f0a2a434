"""Console sessions: a random id in the cookie, stored hashed, bound to the token that
signed in, and ended by sign-out, revocation, expiry, idleness or a new admin secret.

Every test runs on SQLite and PostgreSQL (the ``api`` fixture). Times are moved by
editing the session's row in the real database, never by waiting.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from alembic import command
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import inspect, select, text, update
from sqlalchemy.orm import Session

from shardstream.server.app import create_app
from shardstream.server.config import Settings
from shardstream.server.db import make_engine
from shardstream.server.migrate import alembic_config, current_revision, upgrade
from shardstream.server.models import ConsoleSessionRow, TokenRow, utcnow
from tests.fixtures.console import browser, csrf_of, mint, sign_in
from tests.server.conftest import ADMIN

COOKIE = "shardstream_console"


def cookie_of(client: TestClient) -> str:
    value = client.cookies.get(COOKIE)
    assert value, "no session cookie"
    return str(value)


def signed_out(response: httpx.Response) -> bool:
    """Whether a console page answered with the way to the sign-in form."""
    location = str(response.headers.get("location", ""))
    return response.status_code == 303 and location.startswith("/ui/login")


def with_cookie(app: FastAPI, value: str) -> TestClient:
    client = browser(app)
    client.cookies.set(COOKIE, value, path="/ui")
    return client


def sessions(app: FastAPI) -> list[dict[str, Any]]:
    """Every stored session's columns (through the model: timestamps come back aware)."""
    columns = ConsoleSessionRow.__table__.columns.keys()
    with Session(app.state.engine) as session:
        rows = session.scalars(select(ConsoleSessionRow).order_by(ConsoleSessionRow.id))
        return [{c: getattr(r, c) for c in columns} for r in rows]


def set_times(app: FastAPI, **columns: Any) -> None:
    """Move every session's timestamps, as a clock would."""
    with Session(app.state.engine) as session:
        session.execute(update(ConsoleSessionRow).values(**columns))
        session.commit()


def from_now(delta: timedelta) -> datetime:
    return utcnow() + delta


def test_the_cookie_is_a_session_id_not_the_token(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, ADMIN)
    cookie = cookie_of(client)
    assert ADMIN not in cookie and len(cookie) >= 40
    secret = mint(api, "reader", ["read"])
    other = sign_in(app, secret)
    assert secret not in cookie_of(other) and cookie_of(other) != cookie
    # Stored hashed: the database never holds the cookie's value.
    stored = sessions(app)
    assert len(stored) == 2
    hashes = {r["id_hash"] for r in stored}
    assert hashlib.sha256(cookie.encode()).hexdigest() in hashes
    assert not any(cookie in str(v) for r in stored for v in r.values())


def test_the_cookie_is_never_an_api_credential_nor_the_token_a_cookie(
    api: TestClient, app: FastAPI
) -> None:
    client = sign_in(app, ADMIN)
    cookie = cookie_of(client)
    bearer = browser(app).get("/v1/datasets", headers={"Authorization": f"Bearer {cookie}"})
    assert bearer.status_code == 401
    as_cookie = browser(app)
    as_cookie.cookies.set(COOKIE, cookie)  # for every path, the API included
    assert as_cookie.get("/v1/datasets").status_code == 401
    # The other way round: a token secret in the cookie opens no console page.
    assert signed_out(with_cookie(app, ADMIN).get("/ui/datasets"))
    # And a bearer header does not open the console either: the console is sessions only.
    header_only = browser(app).get("/ui/datasets", headers={"Authorization": f"Bearer {ADMIN}"})
    assert signed_out(header_only)
    assert client.get("/ui/datasets").status_code == 200


def test_signing_out_ends_the_session_for_every_copy_of_the_cookie(
    api: TestClient, app: FastAPI
) -> None:
    client = sign_in(app, mint(api, "reader", ["read"]))
    cookie = cookie_of(client)
    copy = with_cookie(app, cookie)  # a stolen or leftover copy of the cookie
    assert copy.get("/ui/datasets").status_code == 200
    csrf = csrf_of(client.get("/ui/datasets").text)
    out = client.post("/ui/logout", data={"csrf": csrf})
    assert out.status_code == 303 and 'shardstream_console=""' in out.headers["set-cookie"]
    assert signed_out(copy.get("/ui/datasets"))
    assert signed_out(with_cookie(app, cookie).get("/ui/runs"))
    assert sessions(app) == []
    late = with_cookie(app, cookie).post("/ui/logout", data={"csrf": csrf})
    assert late.status_code == 401  # an ended session cannot post anything either


def test_revoking_a_token_through_the_api_ends_its_sessions(api: TestClient, app: FastAPI) -> None:
    secret = mint(api, "reader", ["read"])
    client = sign_in(app, secret)
    keeper = sign_in(app, ADMIN)
    assert client.get("/ui/datasets").status_code == 200
    token_id = next(t["id"] for t in api.get("/v1/tokens").json()["items"] if t["name"] == "reader")
    assert api.delete(f"/v1/tokens/{token_id}").status_code == 200
    assert signed_out(client.get("/ui/datasets"))
    assert [r["token_id"] for r in sessions(app)] == [None]  # only the admin's is left
    assert keeper.get("/ui/datasets").status_code == 200


def test_sessions_end_at_their_absolute_expiry(api: TestClient, app: FastAPI) -> None:
    client = sign_in(app, ADMIN)
    (row,) = sessions(app)
    lifetime = row["expires_at"] - row["created_at"]
    assert lifetime == timedelta(hours=app.state.settings.console_session_hours)
    set_times(app, expires_at=from_now(timedelta(seconds=-1)))
    assert signed_out(client.get("/ui/datasets"))


def test_sessions_end_when_idle_and_activity_keeps_them(api: TestClient, app: FastAPI) -> None:
    idle = timedelta(minutes=app.state.settings.console_idle_minutes)
    client = sign_in(app, ADMIN)
    set_times(app, last_seen_at=from_now(-idle + timedelta(minutes=2)))
    assert client.get("/ui/datasets").status_code == 200  # still within the idle timeout
    (row,) = sessions(app)
    assert utcnow() - row["last_seen_at"] < timedelta(minutes=1)  # the visit was recorded
    set_times(app, last_seen_at=from_now(-idle - timedelta(seconds=1)))
    assert signed_out(client.get("/ui/datasets"))


def test_an_expiring_token_ends_its_session(api: TestClient, app: FastAPI) -> None:
    soon = (utcnow() + timedelta(hours=1)).isoformat()
    made = api.post("/v1/tokens", json={"name": "short", "scopes": ["read"], "expires_at": soon})
    client = sign_in(app, made.json()["secret"])
    (row,) = sessions(app)
    assert client.get("/ui/datasets").status_code == 200
    with Session(app.state.engine) as session:
        token = session.get(TokenRow, row["token_id"])
        assert token is not None
        token.expires_at = from_now(timedelta(seconds=-1))
        session.commit()
    app.state.token_cache.forget(row["token_id"])
    assert signed_out(client.get("/ui/datasets"))


def test_a_new_admin_secret_ends_the_bootstrap_admins_sessions(
    api: TestClient, app: FastAPI, settings: Settings
) -> None:
    client = sign_in(app, ADMIN)
    cookie = cookie_of(client)
    rotated = create_app(
        settings.model_copy(update={"admin_token": SecretStr("ss_rotated_admin_secret_x")})
    )
    try:
        with TestClient(rotated, follow_redirects=False) as other:
            other.cookies.set(COOKIE, cookie, path="/ui")
            assert signed_out(other.get("/ui/datasets"))
    finally:
        rotated.state.engine.dispose()
    same = create_app(settings)
    try:
        with TestClient(same, follow_redirects=False) as again:
            again.cookies.set(COOKIE, cookie, path="/ui")
            assert again.get("/ui/datasets").status_code == 200  # survives a restart
    finally:
        same.state.engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0005_adds_the_session_table_and_keeps_tokens(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'old.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    engine = make_engine(url)
    try:
        upgrade(engine, "0004_run_owner")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tokens (id, name, prefix, secret_hash, scopes, created_at) "
                    "VALUES (3, 'old', 'ss_x', :h, 'read', CURRENT_TIMESTAMP)"
                ),
                {"h": "a" * 64},
            )
        assert upgrade(engine, "0005_console_sessions") == (
            "0004_run_owner",
            "0005_console_sessions",
        )
        with Session(engine) as session:
            assert session.get(TokenRow, 3) is not None
            session.add(
                ConsoleSessionRow(
                    id_hash="b" * 64, token_id=3, binding="c" * 64, expires_at=utcnow()
                )
            )
            session.commit()
            session.delete(session.get(TokenRow, 3))
            session.commit()  # a token's sessions go with it (ON DELETE CASCADE)
            assert session.scalars(select(ConsoleSessionRow)).all() == []
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0004_run_owner")
        assert current_revision(engine) == "0004_run_owner"
        assert "console_sessions" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
