"""The server's request metrics: a request its client abandoned is no server error.

A real uvicorn server and a raw socket that sends half a body and hangs up: before the
fix this was counted as status 500 on route ``<unmatched>``, so 5xx alerts fired for
clients that gave up (a training job killed mid-commit, a closed browser tab).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fixtures.server import LiveServer, start_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with start_server(tmp_path / "srv") as live:
        yield live


def _request_lines(server: LiveServer) -> list[str]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return [
        line for line in text.splitlines() if line.startswith("shardstream_http_requests_total{")
    ]


def _wait_for(server: LiveServer, needle: str) -> list[str]:
    """The request-count lines once one of them contains ``needle`` (the server records a
    request when its handler returns, a moment after the client hung up)."""
    deadline = time.monotonic() + 30
    while True:
        lines = _request_lines(server)
        if any(needle in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _abandon(server: LiveServer, path: str, *, body_sent: int, declared: int) -> None:
    """POST ``path`` declaring ``declared`` body bytes, send ``body_sent`` of them, hang up."""
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
            f"Authorization: Bearer {server.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        sock.sendall(head.encode() + b"{" * body_sent)
        # Let the server start reading the body before the client goes away.
        time.sleep(0.2)


def test_a_request_abandoned_mid_body_is_a_client_disconnect(server: LiveServer) -> None:
    _abandon(server, "/v1/datasets", body_sent=10, declared=1000)
    lines = _wait_for(server, 'method="POST"')
    disconnects = [line for line in lines if 'status="client_disconnect"' in line]
    assert disconnects, lines
    assert 'method="POST"' in disconnects[0], disconnects
    assert not [line for line in lines if 'status="5' in line], lines
    # The body guard stopped it before routing: no route, and the label says so.
    assert 'route="<unmatched>"' in disconnects[0], disconnects


def test_answered_requests_keep_their_status(server: LiveServer) -> None:
    response = httpx.get(f"{server.url}/v1/datasets/none-here", headers=server.headers)
    assert response.status_code == 404
    lines = _wait_for(server, 'status="404"')
    assert any('route="/v1/datasets/{name}"' in line and 'status="404"' in line for line in lines)
    assert not [line for line in lines if "client_disconnect" in line], lines
