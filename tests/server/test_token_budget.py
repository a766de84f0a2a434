"""One token cannot take a server process for itself: the per-token request budget.

The policy (:class:`TokenAccounts`) is checked with a hand-driven clock; the live test
floods a real server (uvicorn on loopback) with one read token's requests on many
connections while another token reads: the flood is answered 429 with ``Retry-After``,
the other token's requests all succeed.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from shardstream.api_client import APIClient
from shardstream.server.budget import TokenAccounts, TokenBudget
from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_bounded_in_flight_and_in_server_time() -> None:
    clock = _Clock()
    accounts = TokenAccounts(TokenBudget(concurrency=2, busy_s=0.5, burst_s=1.0), clock=clock)
    assert accounts.admit("hostile") is None
    assert accounts.admit("hostile") is None
    crowded = accounts.admit("hostile")
    assert crowded is not None and crowded.retry_after_s == 1
    assert "SHARDSTREAM_TOKEN_CONCURRENCY" in crowded.detail
    assert accounts.admit("other") is None  # another token has its own account
    accounts.release("hostile", 2.0)
    accounts.release("hostile", 2.0)  # 4 s used against a 1 s burst: 3 s in debt
    broke = accounts.admit("hostile")  # while "other" has a request in the server
    assert broke is not None and broke.retry_after_s == 6  # 3 s of debt at 0.5 s/s
    assert "SHARDSTREAM_TOKEN_BUSY_S" in broke.detail
    assert accounts.admit("hostile", time_exempt=True) is None  # a commit still goes
    accounts.release("hostile", 0.0)
    clock.now += 5.0  # 2.5 s repaid: still 0.5 s in debt
    assert accounts.admit("hostile") is not None
    accounts.release("other", 0.0)
    # Alone in the server, a token in debt goes on at its sustained rate: one request in
    # flight at a time for 0.5 s per second (refusing it would leave the server idle).
    assert accounts.admit("hostile") is None
    assert accounts.admit("hostile") is not None
    accounts.release("hostile", 0.0)
    clock.now += 1.5  # repaid
    assert accounts.admit("other") is None
    assert accounts.admit("hostile") is None
    assert accounts.in_flight("hostile") == 1


def test_idle_accounts_are_forgotten() -> None:
    clock = _Clock()
    accounts = TokenAccounts(TokenBudget(concurrency=1, busy_s=1.0, burst_s=1.0), clock=clock)
    for i in range(20_000):  # bogus credentials, one request each
        assert accounts.admit(f"k{i}") is None
        accounts.release(f"k{i}", 0.0)
    assert len(accounts._accounts) <= 10_000


def _flood(
    url: str, headers: dict[str, str], path: str, seen: Counter[str], stop: threading.Event
) -> None:
    """Ask for ``path`` back to back, ignoring Retry-After, until ``stop``; count answers
    (``"200"``, ``"429"``) and refusals' reasons (``"in flight"``, ``"time"``)."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for _ in range(20_000):  # until told to stop; bounded all the same
            if stop.is_set():
                return
            answer = client.get(path)
            seen[str(answer.status_code)] += 1
            if answer.status_code == 429:
                assert int(answer.headers["retry-after"]) >= 1
                detail = answer.json()["detail"]
                seen["time" if "SHARDSTREAM_TOKEN_BUSY_S" in detail else "in flight"] += 1


def test_a_flooding_token_gets_429_while_another_token_is_served(tmp_path: Path) -> None:
    # Set up with the default budget, then serve the same database with a tiny one.
    with (
        start_server(tmp_path / "server", storage_roots=tmp_path.as_uri()) as server,
        httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as admin,
    ):
        make_published(admin, "corpus", tmp_path / "corpus", shards=200)  # type: ignore[arg-type]
        secrets = []
        for name in ("hostile", "other"):
            body = {"name": name, "scopes": ["read"], "datasets": ["corpus"]}
            made = admin.post("/v1/tokens", json=body)
            assert made.status_code == 201, made.text
            secrets.append({"Authorization": f"Bearer {made.json()['secret']}"})
    with start_server(
        tmp_path / "server",
        storage_roots=tmp_path.as_uri(),
        token_concurrency=2,
        token_busy_s=0.05,
        token_burst_s=5.0,
    ) as server:
        hostile, other = secrets
        index = "/v1/datasets/corpus/versions/1/shards?limit=1000"  # the costliest read here
        seen: Counter[str] = Counter()
        stop = threading.Event()
        flood = [
            threading.Thread(target=_flood, args=(server.url, hostile, index, seen, stop))
            for _ in range(8)
        ]
        for thread in flood:
            thread.start()
        served: Counter[int] = Counter()
        try:
            while not seen["time"] and all(t.is_alive() for t in flood):
                time.sleep(0.05)  # the flood spends its burst of server time first
            with httpx.Client(base_url=server.url, headers=other, timeout=60) as client:
                for _ in range(3):  # meanwhile the flood goes on
                    served[client.get(index).status_code] += 1
                    for _ in range(3):
                        served[client.get("/v1/datasets/corpus").status_code] += 1
        finally:
            stop.set()
            for thread in flood:
                thread.join()
        assert seen["in flight"] > 0, seen  # the flood was refused beyond 2 in flight...
        assert seen["time"] > 0, seen  # ...and for time once its burst was spent...
        assert seen["200"] > 0, seen  # ...yet not shut out
        assert set(seen) == {"200", "429", "in flight", "time"}, seen
        assert set(served) == {200}, served  # the other token was never refused


def test_requests_without_a_credential_and_health_checks_are_not_counted(
    live_server: LiveServer,
) -> None:
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        for _ in range(50):
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/datasets").status_code == 401


def test_the_sdk_waits_out_a_429_and_retries(tmp_path: Path) -> None:
    """A token in debt while another caller is in the server: a raw request is refused,
    the SDK's same request waits for the Retry-After and then gets its answer."""
    with (
        start_server(
            tmp_path / "server", token_concurrency=0, token_busy_s=0.1, token_burst_s=0.001
        ) as server,
        httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as raw,
    ):
        made = raw.post("/v1/tokens", json={"name": "other", "scopes": ["write"]})
        assert made.status_code == 201, made.text
        # The other caller: a write whose body is still coming (in the server for
        # up to SHARDSTREAM_BODY_TIMEOUT_S).
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as other:
            head = (
                "POST /v1/datasets HTTP/1.1\r\nHost: test\r\n"
                f"Authorization: Bearer {made.json()['secret']}\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            )
            other.sendall(head.encode() + b'{"name": "')
            refused = None
            for _ in range(200):  # spend the budget: each request costs some time
                answer = raw.get("/v1/datasets")
                if answer.status_code == 429:
                    refused = answer
                    break
            assert refused is not None, "the budget was never spent"
            assert int(refused.headers["retry-after"]) >= 1
            with APIClient(server.url, server.token) as api:
                assert list(api.list_datasets()) == []
