"""Request bodies are bounded before parsing: the caller first, then size and time.

Raw sockets stand in for misbehaving clients (a body declared but never sent, a body
that never ends, a huge body without a token); the assertions are the effects: an
answer arrives although the body was not sent, nothing was created, another client's
write went through meanwhile, the server's memory stayed put.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from shardstream.server.limits import BodyLimits
from tests.fixtures.server import LiveServer, server_process, start_server
from tests.server.conftest import make_published

MiB = 1 << 20


def _connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80))
    sock.settimeout(15)
    return sock


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP response (status, lower-cased headers, body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), headers, body


def _auth(server: LiveServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


@pytest.fixture
def small(tmp_path: Path) -> Iterator[LiveServer]:
    """A server on SQLite with a 64 KiB body limit and a 1 s body timeout."""
    with start_server(
        tmp_path / "small",
        max_body_bytes=64 * 1024,
        max_shard_batch_bytes=1 * MiB,
        body_timeout_s=1.0,
        storage_roots=tmp_path.as_uri(),
    ) as server:
        yield server


def _datasets(server: LiveServer) -> list[str]:
    page = httpx.get(f"{server.url}/v1/datasets", headers=_auth(server)).json()
    return [item["name"] for item in page["items"]]


def test_a_declared_oversized_body_is_refused_before_it_is_sent(small: LiveServer) -> None:
    with closing(_connect(small.url)) as sock:
        headers = {**_auth(small), "Content-Type": "application/json", "Content-Length": "10000000"}
        sock.sendall(_head("POST", "/v1/datasets", headers))
        status, answer, body = _response(sock)  # not one byte of the body was sent
    assert status == 413
    assert "SHARDSTREAM_MAX_BODY_BYTES" in json.loads(body)["detail"]
    assert answer.get("connection") == "close"
    assert _datasets(small) == []


def test_a_chunked_body_is_counted_while_it_streams(small: LiveServer) -> None:
    """No Content-Length to trust: the guard counts bytes as they arrive and stops at the
    limit, although the client keeps sending."""
    sent = 0
    with closing(_connect(small.url)) as sock:
        headers = {**_auth(small), "Content-Type": "application/json"}
        sock.sendall(_head("POST", "/v1/datasets", {**headers, "Transfer-Encoding": "chunked"}))
        piece = b'{"name": "big", "description": "' + b"x" * 16_000
        try:
            while sent < 4 * MiB:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except OSError:
            pass  # the server answered and closed the connection: it stopped reading
        status, _, body = _response(sock)
    assert status == 413
    assert "65536 bytes" in json.loads(body)["detail"]
    assert _datasets(small) == []


def test_shard_batches_have_their_own_larger_limit(small: LiveServer) -> None:
    """100 KB is over the general limit but within SHARDSTREAM_MAX_SHARD_BATCH_BYTES."""
    body = {"shards": [{"index": 0, "key": "a.mds", "pad": "x" * 100_000}]}
    refused = httpx.post(f"{small.url}/v1/datasets", json=body, headers=_auth(small))
    assert refused.status_code == 413
    batch = httpx.post(
        f"{small.url}/v1/datasets/nope/versions/1/shards", json=body, headers=_auth(small)
    )
    assert batch.status_code not in (413, 500)  # parsed and judged by the route (404/422)
    assert BodyLimits().for_request("POST", "/v1/datasets/a/versions/2/shards")[0] == 64 * MiB
    assert BodyLimits().for_request("POST", "/v1/datasets")[0] == 8 * MiB


@pytest.mark.parametrize("token", [None, "ss_not_a_token_at_all_000000"])
def test_a_body_without_a_valid_token_is_never_read(small: LiveServer, token: str | None) -> None:
    headers = {"Content-Type": "application/json", "Content-Length": "1000"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with closing(_connect(small.url)) as sock:
        sock.sendall(_head("POST", "/v1/datasets", headers))  # and no body at all
        status, answer, body = _response(sock)
    assert status == 401
    assert answer.get("www-authenticate") == "Bearer"
    assert json.loads(body)["detail"]


def test_a_body_that_never_finishes_gets_408(small: LiveServer) -> None:
    with closing(_connect(small.url)) as sock:
        headers = {**_auth(small), "Content-Type": "application/json", "Content-Length": "1000"}
        sock.sendall(_head("POST", "/v1/datasets", headers) + b'{"name": "')
        status, _, body = _response(sock)
    assert status == 408
    assert "SHARDSTREAM_BODY_TIMEOUT_S" in json.loads(body)["detail"]
    assert _datasets(small) == []


@contextmanager
def _stalled_posts(server: LiveServer, paths: list[str]) -> Iterator[None]:
    """POSTs (with and without a token) that declare 1000 bytes, send 10, and stay open."""
    socks = []
    try:
        for i, path in enumerate(paths):
            sock = _connect(server.url)
            headers = {"Content-Type": "application/json", "Content-Length": "1000"}
            if i % 2 == 0:
                headers.update(_auth(server))
            sock.sendall(_head("POST", path, headers) + b'{"name": "')
            socks.append(sock)
        time.sleep(0.3)  # let the server take them in
        yield
    finally:
        for sock in socks:
            sock.close()


def test_a_stalled_body_holds_no_sqlite_write_gate(live_server: LiveServer) -> None:
    """A POST whose body never finishes used to hold SQLite's write gate (taken before the
    body was read) for as long as its socket stayed open: every write waited on it."""
    assert live_server.database_url.startswith("sqlite")
    with httpx.Client(base_url=live_server.url, headers=_auth(live_server), timeout=20) as api:
        root = live_server.storage_root.parent.parent / "wiki"  # under the storage roots
        make_published(api, "wiki", root)  # type: ignore[arg-type]
        sources = [{"dataset": "wiki", "version": 1}]
        run = api.post("/v1/runs", json={"sources": sources, "global_batch_size": 8})
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        stalled = ["/v1/datasets", f"/v1/runs/{run_id}/checkpoints", "/v1/datasets", "/v1/tokens"]
        with _stalled_posts(live_server, stalled):
            for step in (1, 2):
                start = time.monotonic()
                commit = api.post(
                    f"/v1/runs/{run_id}/checkpoints",
                    json={"step": step, "epoch": 0, "sample_in_epoch": 8 * step},
                )
                created = api.post("/v1/datasets", json={"name": f"other{step}"})
                elapsed = time.monotonic() - start
                assert commit.status_code == 201, commit.text
                assert created.status_code == 201, created.text
                # The stalled bodies time out after 30 s: finishing well before means the
                # writes never waited on them.
                assert elapsed < 2.0, f"two writes took {elapsed:.1f} s beside stalled bodies"


def _send_large(
    url: str, headers: dict[str, str], total: int, results: list[tuple[int, int | None]]
) -> None:
    """Send up to ``total`` body bytes; record (bytes the server took, its status or None)."""
    piece = b"x" * MiB
    sent = 0
    status: int | None = None
    with closing(_connect(url)) as sock:
        try:
            sock.sendall(_head("POST", "/v1/datasets", headers))
            chunked = headers.get("Transfer-Encoding") == "chunked"
            while sent < total:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
        except OSError:
            pass
        try:
            status = _response(sock)[0]
        except OSError:
            status = None  # reset before the answer could be read: the body was refused
    results.append((sent, status))


@pytest.mark.slow
def test_large_bodies_leave_memory_and_the_event_loop_alone(tmp_path: Path) -> None:
    """Four 150 MB bodies at once (three without a token, two of them declared and one
    chunked; one chunked with a token): answered 401/413 without being read, the
    process's memory barely moves, /healthz answers meanwhile."""
    token = "ss_admin_limits_test_0123456789"
    env = {"SHARDSTREAM_ADMIN_TOKEN": token, "SHARDSTREAM_STORAGE_ROOTS": tmp_path.as_uri()}
    with server_process(tmp_path / "proc", env=env) as server:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, headers=auth, timeout=10) as api:
            for i in range(3):  # warm up: the first requests allocate what every request needs
                assert api.post("/v1/datasets", json={"name": f"warm{i}"}).status_code == 201
            before = server.rss_bytes()
            total = 150 * MiB
            results: list[tuple[int, int | None]] = []
            senders = [
                threading.Thread(target=_send_large, args=(server.url, h, total, results))
                for h in (
                    {"Content-Type": "application/json", "Content-Length": str(total)},
                    {"Content-Type": "application/json", "Content-Length": str(total)},
                    {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                    {**auth, "Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                )
            ]
            for sender in senders:
                sender.start()
            peak = before
            health: list[int] = []
            while any(sender.is_alive() for sender in senders):
                health.append(httpx.get(f"{server.url}/healthz", timeout=10).status_code)
                peak = max(peak, server.rss_bytes())
                time.sleep(0.05)
            for sender in senders:
                sender.join()
            peak = max(peak, server.rss_bytes())
            assert health and set(health) == {200}
            assert len(results) == 4
            for sent, status in results:
                assert sent < total, "the server read a whole 150 MB body it should refuse"
                assert status in (401, 413, None)
            grown = (peak - before) / MiB
            print(f"server RSS {before / MiB:.0f} -> peak {peak / MiB:.0f} MiB; {results}")
            assert grown < 48, f"server RSS grew {grown:.0f} MiB for four refused bodies"
            assert api.get("/healthz").status_code == 200


# Header names and values are case-insensitive (RFC 9110), and a coding list may end in
# chunked: every spelling must meet the same bounds as the lower-case one.
CHUNKED_SPELLINGS = ["chunked", "Chunked", "CHUNKED", "cHuNkEd", "gzip, chunked", "gzip,Chunked"]


def _chunked_post_headers(server: LiveServer, path: str, spelling: str) -> dict[str, str]:
    """A JSON post with a token to the API, a sign-in form post (no token) to the console."""
    if path.startswith("/v1"):
        return {**_auth(server), "Content-Type": "application/json", "Transfer-Encoding": spelling}
    form = "application/x-www-form-urlencoded"
    return {"Content-Type": form, "Origin": "http://test", "Transfer-Encoding": spelling}


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.mark.parametrize("spelling", CHUNKED_SPELLINGS)
@pytest.mark.parametrize("path", ["/ui/login", "/v1/datasets"])
def test_every_chunked_spelling_is_bounded_in_size(
    small: LiveServer, spelling: str, path: str
) -> None:
    """The body is sent up to one piece past the limit and then the client waits: the
    server must answer 413 from what it has (a server still buffering would wait for the
    rest and never answer). The sign-in form is read without a token: the red team's
    unauthenticated 256 MiB post."""
    limit = 64 * 1024  # the console's form limit and this server's API limit
    piece = b"x" * 8192
    headers = _chunked_post_headers(small, path, spelling)
    with closing(_connect(small.url)) as sock:
        sock.sendall(_head("POST", path, headers))
        sent = 0
        try:
            while sent <= limit:
                sock.sendall(_chunk(piece))
                sent += len(piece)
        except OSError:
            pass  # answered and closed already
        status, answer, body = _response(sock)
    assert status == 413, body
    assert f"{limit} bytes" in json.loads(body)["detail"]
    assert answer.get("connection") == "close"
    assert sent <= limit + len(piece)
    assert _datasets(small) == []


def _drip_until_answered(sock: socket.socket, *, drops: int) -> bytes | None:
    """Send one body byte at a time (0.05 s apart) until the server answers; its first
    bytes, or None when ``drops`` bytes went out unanswered."""
    for _ in range(drops):
        with suppress(OSError):  # closed by the server: its answer waits to be read
            sock.sendall(_chunk(b"x"))
        # poll, not select: a long test session holds descriptors past select's 1024.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if poller.poll(50):
            return sock.recv(65536, socket.MSG_PEEK)
    return None


@pytest.mark.parametrize("spelling", CHUNKED_SPELLINGS)
@pytest.mark.parametrize("path", ["/ui/login", "/v1/datasets"])
def test_every_chunked_spelling_is_bounded_in_time(
    small: LiveServer, spelling: str, path: str
) -> None:
    """A body dripped a byte at a time never ends by itself: the server cuts it off with
    408 (SHARDSTREAM_BODY_TIMEOUT_S is 1 s here), long before 300 drops (15 s) went out."""
    headers = _chunked_post_headers(small, path, spelling)
    with closing(_connect(small.url)) as sock:
        sock.sendall(_head("POST", path, headers))
        first = _drip_until_answered(sock, drops=300)
        assert first is not None, "the server took a dripping body for 15 s without answering"
        status, answer, body = _response(sock)
    assert status == 408, body
    assert "SHARDSTREAM_BODY_TIMEOUT_S" in json.loads(body)["detail"]
    assert answer.get("connection") == "close"
