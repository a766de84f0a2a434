"""Publish is bounded in time and holds no database connection while it checks storage.

A storage host that drips one byte at a time never trips a read timeout; only the total
deadline (``SHARDSTREAM_STORAGE_DEADLINE_S``) ends such a check. While several publishes
are stuck on it, with the smallest connection pool, every other request still answers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from shardstream.server.db import make_engine
from tests.fixtures.postgres import truncate_all
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import start_server

DEADLINE_S = 12.0  # generous: opening S3 clients takes seconds on a loaded machine
PUBLISHES = 4


class DripServer:
    """Accepts HTTP requests and answers one byte every ``interval_s``, never finishing."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.append(conn)
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 100_000
        try:
            conn.recv(65536)  # the request (headers fit one read on loopback)
            for byte in answer:
                if self._stop.wait(self.interval_s):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            return

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            for conn in self._open:
                conn.close()


@pytest.fixture
def drip() -> Iterator[DripServer]:
    server = DripServer()
    yield server
    server.stop()


def test_publish_gives_up_at_the_deadline_and_holds_no_connection(
    db_url: str,
    tmp_path: Path,
    s3_bucket: S3Bucket,
    drip: DripServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = make_engine(db_url)
    truncate_all(engine)
    engine.dispose()
    with start_server(
        tmp_path / "srv",
        database_url=db_url,
        migrate_on_start=False,
        storage_root=f"{s3_bucket.url}/teams",
        storage_deadline_s=DEADLINE_S,
        db_pool_size=1,  # at most 3 connections: stuck publishes holding one would show
    ) as live:
        api = httpx.Client(base_url=live.url, headers=live.headers, timeout=60)
        for name in ("slow", "other"):
            assert api.post("/v1/datasets", json={"name": name}).status_code == 201
        # Room for PUBLISHES checks at once (the server's cap, made small for the test).
        live.app.state.stores.check_threads = PUBLISHES
        live.app.state.stores.checks = threading.BoundedSemaphore(PUBLISHES)
        for n in range(1, PUBLISHES + 2):
            assert api.post("/v1/datasets/slow/versions", json={"columns": {}}).status_code == 201
            shards = {"shards": [{"index": 0, "key": f"shard.{n}.mds", "samples": 1,
                                  "raw_bytes": 5, "stored_bytes": 5, "hashes": {}}]}  # fmt: skip
            assert api.post(f"/v1/datasets/slow/versions/{n}/shards", json=shards).is_success
        # The server's S3 store is opened at the first publish: it talks to the drip.
        monkeypatch.setenv("AWS_ENDPOINT_URL", drip.url)

        def publish(n: int) -> tuple[httpx.Response, float]:
            start = time.monotonic()
            r = api.post(f"/v1/datasets/slow/versions/{n}/publish")
            return r, time.monotonic() - start

        with ThreadPoolExecutor(PUBLISHES) as pool:
            futures = [pool.submit(publish, n) for n in range(1, PUBLISHES + 1)]
            while drip.connections < PUBLISHES:  # every check is now stuck in storage
                time.sleep(0.01)
            assert api.get("/readyz").status_code == 200
            assert api.get("/v1/datasets/other").status_code == 200
            assert api.get("/v1/datasets/slow/versions/1").json()["status"] == "draft"
            assert live.app.state.engine.pool.checkedout() == 0  # no connection held
            # One more publish finds every check slot taken: 503 at once, no thread more.
            extra, _ = publish(PUBLISHES + 1)
            assert extra.status_code == 503, extra.text
            assert "already checking storage" in extra.json()["detail"]
            # ...all answered while every publish was still stuck in storage
            assert not any(f.done() for f in futures), [f.result() for f in futures if f.done()]
            results = [f.result() for f in futures]
        for n, (r, took) in enumerate(results, start=1):
            assert r.status_code == 504, r.text
            detail = r.json()["detail"]
            assert f"shard.{n}.mds" in detail and "SHARDSTREAM_STORAGE_DEADLINE_S" in detail
            assert took < DEADLINE_S + 5  # the deadline, not the drip, ended it
        assert api.get("/v1/datasets/slow/versions/1").json()["status"] == "draft"
