"""No client and no database can stall the server.

* 50 clients that start reading a large ``index.json`` and stop hold no database
  connection and no open transaction: other requests, ``/readyz`` included, answer.
* A PostgreSQL that accepts connections but never answers costs a request a few
  seconds and a 503 (``/readyz`` too), never a hung worker; so does a lock another
  session holds (``lock_timeout``).
* A server started while its database is down says why in one line and retries for
  ``SHARDSTREAM_DB_START_TIMEOUT_S``; it comes up when the database does.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from tests.fixtures.postgres import server_url
from tests.fixtures.server import LiveServer, free_port, server_process, start_server
from tests.fixtures.tcp_proxy import SilentProxy

SHARDS = 6000  # with ~1.5 KB MDS entries: a 9 MB index.json, more than socket buffers hold
STALLED_READERS = 50


def _publish_large_version(server: LiveServer, root: Path) -> str:
    """A published version of SHARDS shards with bulky MDS entries; its index.json path."""
    auth = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=auth, timeout=120) as api:
        assert api.post("/v1/datasets", json={"name": "big"}).status_code == 201
        draft = api.post(
            "/v1/datasets/big/versions",
            json={"columns": {"x": "int"}, "storage_root": root.as_uri()},
        )
        assert draft.status_code == 201, draft.text
        base = f"/v1/datasets/big/versions/{draft.json()['number']}"
        root.mkdir(parents=True, exist_ok=True)
        shards = []
        for i in range(SHARDS):
            key = f"shard.{i:05d}.mds"
            (root / key).write_bytes(b"x" * 10)
            mds = {"basename": key, "samples": 3, "padding": "p" * 1500}
            shards.append(
                {"index": i, "key": key, "samples": 3, "raw_bytes": 10, "stored_bytes": 10}
                | {"mds": mds}
            )
        for start in range(0, SHARDS, 5000):
            added = api.post(f"{base}/shards", json={"shards": shards[start : start + 5000]})
            assert added.status_code == 200, added.text
        published = api.post(f"{base}/publish")
        assert published.status_code == 200, published.text
    return f"{base}/index.json"


def _in_transaction(database: str) -> int:
    """Connections to ``database`` that sit idle inside an open transaction."""
    engine = create_engine(server_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = :db "
                        "AND state LIKE 'idle in transaction%'"
                    ),
                    {"db": database},
                ).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.slow
def test_stalled_index_readers_hold_no_database_connection(
    postgres_url: str, tmp_path: Path
) -> None:
    with start_server(
        tmp_path / "server",
        database_url=postgres_url,
        db_pool_size=2,  # 2 + 4 overflow connections in all, against 50 stalled readers
        db_pool_timeout_s=3,
        storage_roots=tmp_path.as_uri(),
    ) as server:
        path = _publish_large_version(server, tmp_path / "big")
        auth = {"Authorization": f"Bearer {server.token}"}
        readers: list[socket.socket] = []
        try:
            request = f"GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: {auth['Authorization']}"
            for _ in range(STALLED_READERS):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
                sock.sendall(f"{request}\r\n\r\n".encode())
                sock.settimeout(10)
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # streaming; then stop
                readers.append(sock)
            time.sleep(1.0)  # every stream is stuck on its client now
            database = make_url(postgres_url).database
            assert database is not None
            assert _in_transaction(database) == 0
            with httpx.Client(base_url=server.url, headers=auth, timeout=20) as api:
                assert api.get("/readyz").status_code == 200
                assert api.get("/v1/datasets").status_code == 200
                assert api.post("/v1/datasets", json={"name": "meanwhile"}).status_code == 201
                whole = api.get(path)  # a reader that does read gets the whole index
                assert whole.status_code == 200
                assert len(whole.json()["shards"]) == SHARDS
        finally:
            for sock in readers:
                sock.close()


@contextmanager
def _silent_database() -> Iterator[str]:
    """A loopback listener that accepts connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{listener.getsockname()[1]}/silent"
    finally:
        stop.set()
        listener.close()
        for conn in accepted:
            conn.close()


def test_a_database_that_never_answers_gives_503_within_seconds(tmp_path: Path) -> None:
    with (
        _silent_database() as url,
        start_server(
            tmp_path / "server",
            database_url=url,
            migrate_on_start=False,
            db_connect_timeout_s=1,
            db_pool_timeout_s=2,
        ) as server,
    ):
        auth = {"Authorization": f"Bearer {server.token}"}
        # A request that hung would end in a ReadTimeout here, not in an answer.
        with httpx.Client(base_url=server.url, headers=auth, timeout=20) as api:
            # /readyz asks the database on a thread of its own and answers past its 2 s
            # deadline (server/health_gate.py), or with the connect timeout's message.
            for _ in range(2):
                ready = api.get("/readyz")
                assert ready.status_code == 503
                assert "did not answer" in ready.json()["detail"], ready.text
            for answer in (
                api.get("/v1/datasets"),
                api.post("/v1/datasets", json={"name": "x"}),
            ):
                assert answer.status_code == 503, answer.text
                assert answer.json()["detail"].startswith("database unavailable")
            assert api.get("/healthz").status_code == 200  # the process itself is fine


def test_a_held_lock_costs_a_request_seconds_not_forever(postgres_url: str, tmp_path: Path) -> None:
    """Another session holding a table lock (a long migration, an operator's psql) makes
    requests fail after SHARDSTREAM_DB_LOCK_TIMEOUT_S with a 503, not wait with it."""
    with start_server(
        tmp_path / "server", database_url=postgres_url, db_lock_timeout_s=1
    ) as server:
        auth = {"Authorization": f"Bearer {server.token}"}
        locker = create_engine(postgres_url)
        try:
            with (
                httpx.Client(base_url=server.url, headers=auth, timeout=20) as api,
                locker.connect() as conn,
            ):
                conn.execute(text("LOCK TABLE datasets IN ACCESS EXCLUSIVE MODE"))
                for answer in (
                    api.post("/v1/datasets", json={"name": "x"}),
                    api.get("/v1/datasets"),
                ):
                    assert answer.status_code == 503, answer.text
                    assert "SHARDSTREAM_DB_LOCK_TIMEOUT_S" in answer.json()["detail"]
                conn.rollback()  # the lock is gone: the same request goes through
                assert api.post("/v1/datasets", json={"name": "x"}).status_code == 201
        finally:
            locker.dispose()


def test_starting_without_a_database_is_one_line_and_bounded(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = {
        **os.environ,
        "SHARDSTREAM_DATA_DIR": str(tmp_path / "data"),
        "SHARDSTREAM_DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:{port}/none",
        "SHARDSTREAM_DB_START_TIMEOUT_S": "2",
        "SHARDSTREAM_PORT": str(free_port()),
    }
    done = subprocess.run(
        [sys.executable, "-m", "shardstream", "server"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1
    assert not any("Traceback" in line for line in output), "\n".join(output)
    assert output[-1].startswith("shardstream: error: ")
    assert "cannot connect to the database server" in output[-1]
    assert "SHARDSTREAM_DB_START_TIMEOUT_S" in output[-1]
    retries = [line for line in output if "waiting for the database" in line]
    assert retries, "\n".join(output)  # it retried, one line per attempt


class _LateDatabase:
    """A TCP forwarder to the real PostgreSQL that starts listening only when told."""

    def __init__(self) -> None:
        self.port = free_port()
        self._listener: socket.socket | None = None

    def open(self) -> None:
        upstream = make_url(server_url())
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            with closing(src), closing(dst):
                try:
                    while data := src.recv(65536):
                        dst.sendall(data)
                except OSError:
                    pass

        def serve() -> None:
            while True:
                try:
                    client = listener.accept()[0]
                except OSError:
                    return
                server = socket.create_connection((upstream.host, upstream.port or 5432))
                threading.Thread(target=pipe, args=(client, server), daemon=True).start()
                threading.Thread(target=pipe, args=(server, client), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()


def test_the_server_comes_up_once_its_database_does(postgres_url: str, tmp_path: Path) -> None:
    late = _LateDatabase()
    url = make_url(postgres_url).set(host="127.0.0.1", port=late.port)
    log = tmp_path / "proc" / "server.log"
    stop = threading.Event()

    def open_once_waited_for() -> None:
        while not stop.wait(0.1):  # the database appears once the server said it waits
            if log.exists() and "waiting for the database" in log.read_text(errors="replace"):
                late.open()
                return

    opener = threading.Thread(target=open_once_waited_for, daemon=True)
    opener.start()
    env = {
        "SHARDSTREAM_DATABASE_URL": url.render_as_string(hide_password=False),
        "SHARDSTREAM_DB_START_TIMEOUT_S": "60",
    }
    try:
        with server_process(tmp_path / "proc", env=env) as server:
            assert httpx.get(f"{server.url}/readyz", timeout=20).status_code == 200
            assert "Traceback" not in log.read_text()
    finally:
        stop.set()
        late.close()


@pytest.fixture
def silent_proxy() -> Iterator[SilentProxy]:
    """A forwarder to the test PostgreSQL that the test can make go silent."""
    upstream = make_url(server_url())
    with SilentProxy(upstream.host or "127.0.0.1", upstream.port or 5432) as proxy:
        yield proxy


def _through(proxy: SilentProxy, postgres_url: str) -> str:
    url = make_url(postgres_url).set(host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def test_a_database_gone_silent_under_open_connections_costs_seconds(
    postgres_url: str, tmp_path: Path, silent_proxy: SilentProxy
) -> None:
    """PostgreSQL stops answering on the connections the server already holds (nothing
    closes them): every request, with a body or without, through a database token or the
    admin secret, answers 503 instead of waiting for a reply that never comes. Before,
    requests with a body hung past 90 s (the pooled connection's liveness ping had no
    deadline on the client side)."""
    with start_server(
        tmp_path / "server",
        database_url=_through(silent_proxy, postgres_url),
        db_connect_timeout_s=1,
        db_statement_timeout_s=2,
        db_pool_timeout_s=2,
        token_cache_s=0,  # every request looks its token up in the database
    ) as server:
        admin = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url, headers=admin, timeout=60) as api:
            minted = api.post("/v1/tokens", json={"name": "w", "scopes": ["write"]})
            assert minted.status_code == 201, minted.text
            writer = {"Authorization": f"Bearer {minted.json()['secret']}"}
            # Several connections open and pooled, as in a server that has been serving.
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                names = [f"d{i}" for i in range(8)]
                made = pool.map(lambda n: api.post("/v1/datasets", json={"name": n}), names)
                assert {m.status_code for m in made} == {201}
            silent_proxy.silence()
            # A hang ends in httpx.ReadTimeout (60 s) here, not in an answer.
            answers = {
                "post (admin)": api.post("/v1/datasets", json={"name": "x"}),
                "post (token)": api.post("/v1/datasets", json={"name": "y"}, headers=writer),
                "post (tokens)": api.post("/v1/tokens", json={"name": "r", "scopes": ["read"]}),
                "get": api.get("/v1/datasets"),
                "get (token)": api.get("/v1/datasets", headers=writer),
            }
            for what, answer in answers.items():
                assert answer.status_code == 503, (what, answer.text)
                assert answer.json()["detail"].startswith("database unavailable"), what
            # /readyz answers on a thread of its own, past its 2 s deadline if need be.
            ready = api.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert "did not answer" in ready.json()["detail"] or ready.json()["detail"].startswith(
                "database unavailable"
            ), ready.text
            assert api.get("/healthz").status_code == 200


def test_a_database_gone_silent_mid_statement_costs_seconds(
    postgres_url: str, tmp_path: Path, silent_proxy: SilentProxy
) -> None:
    """A statement already sent when the database goes silent: its answer (even the
    statement timeout's error) never arrives; the server gives up on the connection
    once the statement timeout and a connect timeout have passed, and answers 503."""
    with start_server(
        tmp_path / "server",
        database_url=_through(silent_proxy, postgres_url),
        db_connect_timeout_s=1,
        db_statement_timeout_s=2,
        db_lock_timeout_s=600,  # the statement waits on the lock until it is cut off
        db_pool_timeout_s=2,
    ) as server:
        admin = {"Authorization": f"Bearer {server.token}"}
        locker = create_engine(postgres_url)  # directly, not through the proxy
        try:
            with (
                httpx.Client(base_url=server.url, headers=admin, timeout=60) as api,
                locker.connect() as conn,
            ):
                assert api.post("/v1/datasets", json={"name": "warm"}).status_code == 201
                conn.execute(text("LOCK TABLE datasets IN ACCESS EXCLUSIVE MODE"))
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    waiting = pool.submit(api.post, "/v1/datasets", json={"name": "blocked"})
                    while not _waits_on_a_lock(conn):
                        time.sleep(0.05)
                    silent_proxy.silence()
                    answer = waiting.result()
                conn.rollback()
            assert answer.status_code == 503, answer.text
            assert answer.json()["detail"].startswith("database unavailable")
        finally:
            locker.dispose()


def _waits_on_a_lock(conn: Connection) -> bool:
    """Whether another session waits on a lock (the request's INSERT, here)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return bool(conn.execute(text(query)).scalar())
