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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from shardstream.api_client import APIClient
from shardstream.server.budget import (
    DEBT_IN_FLIGHT,
    REQUEST_S,
    SHARED_WINDOW_S,
    Refusal,
    Ticket,
    TokenAccounts,
    TokenBudget,
)
from tests.fixtures.server import LiveServer, start_server
from tests.server.conftest import make_published


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_bounded_in_flight() -> None:
    accounts = TokenAccounts(TokenBudget(concurrency=2, busy_s=0), clock=_Clock())
    assert isinstance(accounts.admit("hostile"), Ticket)
    assert isinstance(accounts.admit("hostile"), Ticket)
    crowded = accounts.admit("hostile")
    assert isinstance(crowded, Refusal) and crowded.retry_after_s == 1
    assert "SHARDSTREAM_TOKEN_CONCURRENCY" in crowded.detail
    assert isinstance(accounts.admit("other"), Ticket)  # another token has its own bound


def test_a_token_pays_its_share_of_the_server_and_waits_out_its_debt() -> None:
    clock = _Clock()
    accounts = TokenAccounts(TokenBudget(concurrency=0, busy_s=0.5, burst_s=1.0), clock=clock)
    first, second = accounts.admit("hostile"), accounts.admit("hostile")
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    clock.now += 4.0  # alone with two requests for 4 s: the server's 4 s, 2 s each
    other = accounts.admit("other")
    assert isinstance(other, Ticket)
    accounts.release("hostile", first)
    # 4 s used against a full 1 s burst, plus REQUEST_S a request: just over 3 s in debt
    accounts.release("hostile", second)
    assert accounts.balance("hostile") == pytest.approx(1.0 - 4.0 - 2 * REQUEST_S)
    broke = accounts.admit("hostile")  # while "other" has a request in the server
    assert isinstance(broke, Refusal) and broke.retry_after_s == 7  # 3.004 s at 0.5 s/s
    assert "SHARDSTREAM_TOKEN_BUSY_S" in broke.detail
    clock.now += 5.0  # 2.5 s repaid: still 0.5 s in debt
    assert isinstance(accounts.admit("hostile"), Refusal)
    accounts.release("other", other)
    clock.now += SHARED_WINDOW_S + 0.001  # "other" is gone: "hostile" is alone now
    # Alone in the server, a token in debt goes on a few requests at a time (refusing
    # it would only leave the server idle).
    alone = [accounts.admit("hostile") for _ in range(DEBT_IN_FLIGHT)]
    assert all(isinstance(t, Ticket) for t in alone)
    assert isinstance(accounts.admit("hostile"), Refusal)
    assert accounts.in_flight("hostile") == DEBT_IN_FLIGHT


def test_tokens_in_the_server_together_share_its_time() -> None:
    """Two tokens with one request each for 2 s: each had half the server, 1 s."""
    clock = _Clock()
    budget = TokenBudget(concurrency=0, busy_s=1.0, burst_s=1.0)
    accounts = TokenAccounts(budget, clock=clock)
    a, b = accounts.admit("a"), accounts.admit("b")
    assert isinstance(a, Ticket) and isinstance(b, Ticket)
    clock.now += 2.0
    accounts.release("a", a)
    accounts.release("b", b)
    c = accounts.admit("c")  # a third token in the server: a and b are judged beside it
    assert isinstance(c, Ticket)
    for key in ("a", "b"):  # each paid its 1 s burst and REQUEST_S: in debt
        refused = accounts.admit(key)
        assert isinstance(refused, Refusal), key
        assert refused.retry_after_s == 1


def test_idle_accounts_are_forgotten() -> None:
    clock = _Clock()
    accounts = TokenAccounts(TokenBudget(concurrency=1, busy_s=1.0, burst_s=1.0), clock=clock)
    for i in range(20_000):  # bogus credentials, one request each
        ticket = accounts.admit(f"k{i}")
        assert isinstance(ticket, Ticket)
        accounts.release(f"k{i}", ticket)
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
                assert int(answer.headers["retry-after"]) >= 0  # less the 1 s the answer waited
                detail = answer.json()["detail"]
                seen["time" if "SHARDSTREAM_TOKEN_BUSY_S" in detail else "in flight"] += 1


@contextmanager
def _stalled_write(server: LiveServer, authorization: str = "") -> Iterator[socket.socket]:
    """A POST (with the admin token unless ``authorization`` is given) whose body is still
    coming: in the server until the caller sends the rest, closes it, or
    SHARDSTREAM_BODY_TIMEOUT_S."""
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        head = (
            "POST /v1/datasets HTTP/1.1\r\nHost: test\r\n"
            f"Authorization: {authorization or f'Bearer {server.token}'}\r\n"
            "Content-Type: application/json\r\nContent-Length: 13\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"name": "')
        yield sock


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
        token_burst_s=1.0,
    ) as server:
        hostile, other = secrets
        index = "/v1/datasets/corpus/versions/1/shards?limit=1000"  # the costliest read here
        # The in-flight bound, shown without a race: two of the token's requests held in
        # the server (bodies still coming), a third is refused for it. (A flood alone
        # shows it only when its threads happen to overlap in the server.)
        with (
            _stalled_write(server, hostile["Authorization"]),
            _stalled_write(server, hostile["Authorization"]),
            httpx.Client(base_url=server.url, headers=hostile, timeout=60) as client,
        ):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                crowded = client.get(index)
                if crowded.status_code == 429:
                    break
            assert crowded.status_code == 429, crowded.text
            assert "SHARDSTREAM_TOKEN_CONCURRENCY" in crowded.json()["detail"]
        seen: Counter[str] = Counter()
        stop = threading.Event()
        flood = [
            threading.Thread(target=_flood, args=(server.url, hostile, index, seen, stop))
            for _ in range(4)
        ]
        for thread in flood:
            thread.start()
        served: Counter[int] = Counter()
        try:
            while seen["200"] < 20 and all(t.is_alive() for t in flood):
                time.sleep(0.05)
            time.sleep(2.0)  # alone, the flood spends its 1 s burst and runs into debt
            with (
                _stalled_write(server) as writing,  # a third caller, in the server throughout
                httpx.Client(base_url=server.url, headers=other, timeout=60) as client,
            ):
                for _ in range(3):  # meanwhile the flood goes on
                    served[client.get(index).status_code] += 1
                    for _ in range(3):
                        served[client.get("/v1/datasets/corpus").status_code] += 1
                while not seen["time"] and all(t.is_alive() for t in flood):
                    time.sleep(0.05)  # the flood, in debt, is refused beside the others
                writing.sendall(b'x"}')
        finally:
            stop.set()
            for thread in flood:
                thread.join()
        assert seen["time"] > 0, seen  # the flood was refused for time once its burst was spent...
        assert seen["200"] > 0, seen  # ...yet not shut out
        assert set(seen) <= {"200", "429", "in flight", "time"}, seen
        assert set(served) == {200}, served  # the other token was never refused


def test_health_checks_are_not_counted_and_anonymous_requests_pay_by_address(
    live_server: LiveServer,
) -> None:
    accounts = live_server.app.state.token_accounts
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        for _ in range(50):
            assert client.get("/healthz").status_code == 200
            assert client.get("/readyz").status_code == 200
            assert client.get("/metrics").status_code == 200
        assert accounts._accounts == {}
        for _ in range(50):
            assert client.get("/v1/datasets").status_code == 401
        assert list(accounts._accounts) == ["address:127.0.0.1"]


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
            assert int(refused.headers["retry-after"]) >= 0
            with APIClient(server.url, server.token) as api:
                assert list(api.list_datasets()) == []


def _tokens(server: LiveServer, *names: str, scope: str = "read") -> list[dict[str, str]]:
    headers = []
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as admin:
        for name in names:
            made = admin.post("/v1/tokens", json={"name": name, "scopes": [scope]})
            assert made.status_code == 201, made.text
            headers.append({"Authorization": f"Bearer {made.json()['secret']}"})
    return headers


def test_a_flood_is_refused_while_another_token_keeps_being_served(tmp_path: Path) -> None:
    """Six connections of one token read the costliest page back to back; meanwhile
    another token reads a dataset ten times a second, with no third caller to help: every
    one of its reads is served while the flood is going on, and the flood's requests in
    that time are refused 429 (a caller in debt is refused beside another caller that was
    served within SHARED_WINDOW_S, not only beside one in flight at that instant)."""
    with start_server(
        tmp_path / "server",
        storage_roots=tmp_path.as_uri(),
        token_busy_s=0.05,
        token_burst_s=1.0,
    ) as server:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as admin:
            make_published(admin, "corpus", tmp_path / "corpus", shards=200)  # type: ignore[arg-type]
        hostile, other = _tokens(server, "hostile", "other")
        index = "/v1/datasets/corpus/versions/1/shards?limit=1000"
        events: list[tuple[str, str]] = []  # (who, answer) in the order they came back
        seen: Counter[str] = Counter()
        stop = threading.Event()

        def flood() -> None:
            with httpx.Client(base_url=server.url, headers=hostile, timeout=60) as client:
                while not stop.is_set():
                    answer = client.get(index)
                    seen[str(answer.status_code)] += 1
                    events.append(("flood", str(answer.status_code)))

        # More connections than a caller in debt may keep in flight alone (DEBT_IN_FLIGHT).
        threads = [threading.Thread(target=flood) for _ in range(DEBT_IN_FLIGHT + 2)]
        for thread in threads:
            thread.start()
        try:
            while seen["429"] == 0:  # alone, the flood spends its burst and runs into debt
                assert all(t.is_alive() for t in threads) and seen["200"] < 20_000
                time.sleep(0.05)
            with httpx.Client(base_url=server.url, headers=other, timeout=60) as client:
                # A cheap read every 0.1 s (pacing, well within its budget) until the flood
                # got 10 answers after the first one.
                events.append(("other", str(client.get("/v1/datasets/corpus").status_code)))
                start = len(events)
                while sum(who == "flood" for who, _ in events[start:]) < 10:
                    time.sleep(0.1)
                    events.append(("other", str(client.get("/v1/datasets/corpus").status_code)))
                    assert len(events) - start < 10_000
            flooding = all(t.is_alive() for t in threads)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert flooding  # the other token was served while the flood went on, not after it
        assert {a for who, a in events if who == "other"} == {"200"}
        first = events.index(("other", "200"))
        last = len(events) - 1 - events[::-1].index(("other", "200"))
        beside = Counter(a for who, a in events[first:last] if who == "flood")
        # Only requests the flood had in the server when the other token came could end
        # in 200 after it: none was admitted beside it.
        assert beside["429"] > 0 and beside["200"] <= DEBT_IN_FLIGHT, beside


def test_refused_commits_are_charged_to_their_token(tmp_path: Path) -> None:
    """A read token posting checkpoint commits (each refused 403) beside another token's
    reads: its commits cost it too, and it is refused (429) once its burst is spent."""
    with start_server(
        tmp_path / "server",
        storage_roots=tmp_path.as_uri(),
        token_busy_s=0.01,
        token_burst_s=0.2,
    ) as server:
        with httpx.Client(base_url=server.url, headers=server.headers, timeout=60) as admin:
            make_published(admin, "corpus", tmp_path / "corpus")  # type: ignore[arg-type]
            body = {"sources": [{"dataset": "corpus", "version": 1}], "global_batch_size": 3}
            run = admin.post("/v1/runs", json=body).json()["id"]
        hostile, other = _tokens(server, "hostile", "other")
        commit = {"step": 1, "epoch": 0, "sample_in_epoch": 3, "plan": {}}
        answers: Counter[int] = Counter()
        reads: Counter[int] = Counter()
        with (
            httpx.Client(base_url=server.url, headers=hostile, timeout=60) as committer,
            httpx.Client(base_url=server.url, headers=other, timeout=60) as reader,
        ):
            while not answers[429] and answers[403] < 2_000:  # 0.2 s: 100 x REQUEST_S
                reads[reader.get("/v1/datasets/corpus").status_code] += 1
                for _ in range(10):  # the flood: ten refused commits to each read
                    status = committer.post(f"/v1/runs/{run}/checkpoints", json=commit)
                    answers[status.status_code] += 1
                    if status.status_code == 429:
                        break
        assert answers[429] == 1 and answers[403] > 0, answers
        assert set(reads) == {200}, reads
