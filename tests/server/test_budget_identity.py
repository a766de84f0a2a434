"""Whose account a request is charged to: the authenticated principal, however its
credential is spelled or carried; anything unauthenticated, and every sign-in, to the
client address; each console session a token opens, to the token.

A live server (uvicorn on loopback, SQLite) with one request of a caller held in the
server (a POST whose body is still coming) and a budget of one request in flight: the
next request charged to the same account is refused (429), one charged to another
account is served. No timing: the held request stays until the test lets it go.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shardstream.server.models import ConsoleSessionRow
from tests.fixtures.server import LiveServer, start_server

SECRET_SPELLINGS = ["Bearer {}", "bearer {}", "BEARER {}", "Bearer   {}"]


@contextmanager
def _held(server: LiveServer, path: str, headers: str = "") -> Iterator[socket.socket]:
    """A POST to ``path`` whose body is still coming: in the server until closed."""
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: 100\r\n\r\n"
        sock.sendall(head.encode() + b"x")
        # The guard counts it in before the body guard waits for the rest; wait for that.
        accounts = server.app.state.token_accounts
        deadline = time.monotonic() + 30
        while accounts._in_flight == 0:
            assert time.monotonic() < deadline, "the held request was never counted in"
            time.sleep(0.01)
        yield sock


def _token(server: LiveServer, name: str, scope: str = "read") -> str:
    with httpx.Client(base_url=server.url, headers=server.headers) as admin:
        made = admin.post("/v1/tokens", json={"name": name, "scopes": [scope]})
        assert made.status_code == 201, made.text
        return str(made.json()["secret"])


def _server(tmp_path: Path) -> AbstractContextManager[LiveServer]:
    """A server whose callers may each have one request in flight."""
    return start_server(tmp_path, token_concurrency=1, token_busy_s=1.0, token_burst_s=1000)


def test_every_spelling_of_a_token_shares_its_account(tmp_path: Path) -> None:
    with _server(tmp_path) as server:
        secret, other = _token(server, "flood"), _token(server, "other")
        auth = f"Authorization: Bearer {secret}\r\n"
        with _held(server, "/v1/datasets", auth), httpx.Client(base_url=server.url) as client:
            for spelling in SECRET_SPELLINGS:
                answer = client.get(
                    "/v1/datasets", headers={"Authorization": spelling.format(secret)}
                )
                assert answer.status_code == 429, (spelling, answer.text)
                assert "SHARDSTREAM_TOKEN_CONCURRENCY" in answer.json()["detail"]
            served = client.get("/v1/datasets", headers={"Authorization": f"Bearer {other}"})
            assert served.status_code == 200, served.text


def test_unauthenticated_requests_share_their_address_account(tmp_path: Path) -> None:
    """Junk cookies, unknown tokens and no credential at all: one account (the address),
    so varying them buys nothing; a real token from the same address has its own."""
    with _server(tmp_path) as server:
        secret = _token(server, "reader")
        with _held(server, "/ui/login"), httpx.Client(base_url=server.url) as client:
            for i, headers in enumerate(
                [
                    {"Cookie": "shardstream_console=junk-1"},
                    {"Cookie": "shardstream_console=junk-2; other=x"},
                    {"Authorization": "Bearer ss_not_a_token_0"},
                    {"Authorization": "Basic eDp5"},
                    {},
                ]
            ):
                path = "/ui/datasets" if "Cookie" in headers else "/v1/datasets"
                answer = client.get(path, headers=headers, follow_redirects=False)
                assert answer.status_code == 429, (i, answer.status_code, answer.text)
            mine = client.get("/v1/datasets", headers={"Authorization": f"Bearer {secret}"})
            assert mine.status_code == 200, mine.text


def _sign_in(server: LiveServer, secret: str) -> httpx.Client:
    client = httpx.Client(base_url=server.url, follow_redirects=False)
    answer = client.post("/ui/login", data={"token": secret, "next": "/ui/datasets"})
    assert answer.status_code == 303, answer.text
    return client


def test_a_tokens_console_sessions_share_its_account(tmp_path: Path) -> None:
    with _server(tmp_path) as server:
        secret = _token(server, "reader")
        first, second = _sign_in(server, secret), _sign_in(server, secret)
        try:
            assert first.get("/ui/datasets").status_code == 200
            auth = f"Authorization: Bearer {secret}\r\n"
            with _held(server, "/v1/datasets", auth):
                for browser in (first, second):
                    answer = browser.get("/ui/datasets")
                    assert answer.status_code == 429, answer.text
        finally:
            first.close()
            second.close()


def _sessions(server: LiveServer) -> int:
    with Session(server.app.state.engine) as session:
        return int(session.scalar(select(func.count()).select_from(ConsoleSessionRow)) or 0)


def test_sign_ins_are_charged_to_the_token_and_to_the_address(tmp_path: Path) -> None:
    """A token in debt opens no session, alone in the server or not, while another
    token signs in from the same address; an address that spent its budget on sign-ins
    (good or bad tokens) opens none either."""
    with start_server(tmp_path, token_busy_s=0.001, token_burst_s=1.0) as server:
        spender, other = _token(server, "spender"), _token(server, "other")
        with httpx.Client(base_url=server.url) as api:  # the token's account, by the API
            auth = {"Authorization": f"Bearer {spender}"}
            while server.app.state.token_accounts.balance("principal:token:1") > 0:
                assert api.get("/v1/datasets", headers=auth).status_code in (200, 429)
        with httpx.Client(base_url=server.url, follow_redirects=False) as browser:
            refused = browser.post("/ui/login", data={"token": spender})
            assert refused.status_code == 429, refused.text
            assert "SHARDSTREAM_TOKEN_BUSY_S" in refused.text
            assert int(refused.headers["retry-after"]) > 0
            assert "shardstream_console" not in refused.headers.get("set-cookie", "")
            assert _sessions(server) == 0
            assert browser.post("/ui/login", data={"token": other}).status_code == 303
            assert _sessions(server) == 1
            # The address: a 1 s burst pays for a few sign-ins (0.25 s each), then none.
            answers = [
                browser.post("/ui/login", data={"token": "ss_guess"}).status_code for _ in range(8)
            ]
            assert answers[0] == 401 and 429 in answers, answers
            assert browser.post("/ui/login", data={"token": other}).status_code == 429
            assert _sessions(server) == 1
