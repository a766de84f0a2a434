"""Checkpoint commits leave the training loop: sent in the background, in order, bounded,
flushed before exit, and a failure is raised, never lost.

A real server (uvicorn on loopback) behind :class:`~tests.client.tcp_gate.TCPGate`, which
holds, delays or cuts what the client sends, so the server is slow or away for real.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, ServerOptions, ShardstreamLoader, StreamingDataset
from shardstream.client.committer import CheckpointCommitter
from shardstream.errors import ConfigError, ConflictError, ServerUnavailableError
from shardstream.shard_builder.publish import register_index
from tests.client.tcp_gate import TCPGate
from tests.fixtures.datasets import write_tokens
from tests.fixtures.server import LiveServer

N = 64
HANG_S = 20  # how long a call that must return at once may take before the test says so


@pytest.fixture
def run_id(live_server: LiveServer, tmp_path: Path) -> int:
    write_tokens(tmp_path / "ds", N, size_limit=600)
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(tmp_path / "ds" / "index.json"), "tokens")
        return api.create_run([("tokens", 1)], global_batch_size=4).id


@pytest.fixture
def gate(live_server: LiveServer) -> Iterator[TCPGate]:
    where = urlsplit(live_server.url)
    with TCPGate((str(where.hostname), int(where.port or 80))) as proxy:
        yield proxy


def loader_through(
    url: str, live_server: LiveServer, run: int, tmp_path: Path
) -> ShardstreamLoader:
    server = ServerOptions(url=url, token=live_server.token, run=run)
    ds = StreamingDataset(
        str(tmp_path / "ds"), 4, server=server, cache=CacheOptions(dir=tmp_path / "cache")
    )
    return ShardstreamLoader(ds, num_workers=0)


def steps_on_server(live_server: LiveServer, run: int) -> list[int]:
    with APIClient(live_server.url, live_server.token) as api:
        return [c.step for c in api.list_checkpoints(run)]


def returns(call: Callable[[], object]) -> threading.Thread:
    """Run ``call`` in a thread; the caller checks whether it returned."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread


def test_commit_returns_while_the_server_holds_it_and_flush_waits(
    live_server: LiveServer, gate: TCPGate, run_id: int, tmp_path: Path
) -> None:
    loader = loader_through(gate.url, live_server, run_id, tmp_path)
    it = iter(loader)
    gate.gate.clear()  # the server receives nothing from now on
    steps = list(range(1, 13))
    for step in steps:  # ordered: a step below the latest would be refused (409)
        next(it)
        committing = returns(lambda s=step: loader.commit(s))  # type: ignore[misc]
        committing.join(HANG_S)
        assert not committing.is_alive(), "commit() waited for the server"
    assert steps_on_server(live_server, run_id) == []  # none is durable yet
    flushing = returns(loader.flush_commits)
    flushing.join(0.2)
    assert flushing.is_alive(), "flush_commits() returned before the commits were durable"
    gate.gate.set()
    flushing.join(HANG_S)
    assert not flushing.is_alive()
    assert steps_on_server(live_server, run_id) == steps  # every one, in order
    loader.close()


def test_close_flushes_and_wait_true_is_durable(
    live_server: LiveServer, gate: TCPGate, run_id: int, tmp_path: Path
) -> None:
    loader = loader_through(gate.url, live_server, run_id, tmp_path)
    it = iter(loader)
    next(it)
    loader.commit(1, wait=True)
    assert steps_on_server(live_server, run_id) == [1]
    next(it)
    gate.gate.clear()
    loader.commit(2)
    closing = returns(loader.close)
    closing.join(0.2)
    assert closing.is_alive(), "close() returned before the commit was durable"
    gate.gate.set()
    closing.join(HANG_S)
    assert steps_on_server(live_server, run_id) == [1, 2]


def test_a_failed_commit_is_raised_by_the_next_commit_and_logged(
    live_server: LiveServer,
    gate: TCPGate,
    run_id: int,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    loader = loader_through(gate.url, live_server, run_id, tmp_path)
    it = iter(loader)
    for _ in range(3):
        next(it)
    with caplog.at_level(logging.ERROR, logger="shardstream.client"):
        loader.commit(5)
        loader.commit(3)  # a step below the latest: the server refuses it (409)
        next(it)
        with pytest.raises(ConflictError, match=r"run \d+ step 3 .*failed.*409"):
            loader.commit(6, wait=True)
    assert any("step 3" in r.getMessage() for r in caplog.records)
    loader.commit(7, wait=True)  # raised once: the committer goes on
    loader.flush_commits()
    assert steps_on_server(live_server, run_id) == [5, 6, 7]
    loader.close()


def test_commit_rides_out_cut_connections(
    live_server: LiveServer, run_id: int, tmp_path: Path
) -> None:
    where = urlsplit(live_server.url)
    with TCPGate((str(where.hostname), int(where.port or 80)), cut_first=3) as flaky:
        loader = loader_through(flaky.url, live_server, run_id, tmp_path)
        next(iter(loader))
        loader.commit(1)
        loader.flush_commits()
        assert flaky.cut_first == 0
        assert steps_on_server(live_server, run_id) == [1]
        loader.close()


def test_a_commit_is_retried_by_one_loop_until_its_deadline(
    live_server: LiveServer, run_id: int
) -> None:
    """The committer hands the API client a deadline (``retry_for_s``) instead of looping
    over the client's own bounded retries: a server refusing with 429 for longer than the
    client's usual attempts still gets the commit (the nested loops gave up: a 429 past
    the client's retries was final)."""
    refusals = 7  # one more than the client's usual 6 attempts
    seen: list[int] = []
    server = httpx.HTTPTransport()

    def busy_then_real(request: httpx.Request) -> httpx.Response:
        seen.append(1)
        if len(seen) <= refusals:
            return httpx.Response(429, headers={"Retry-After": "0"}, json={"detail": "busy"})
        answer = server.handle_request(request)
        answer.read()
        return answer

    committer = CheckpointCommitter(
        live_server.url,
        live_server.token,
        retry_for_s=600.0,
        client=lambda: APIClient(
            live_server.url,
            live_server.token,
            backoff_s=0.001,
            transport=httpx.MockTransport(busy_then_real),
        ),
    )
    committer.submit(run_id, step=1, epoch=0, sample_in_epoch=4, plan={})
    committer.close(timeout=HANG_S)
    assert len(seen) == refusals + 1
    assert steps_on_server(live_server, run_id) == [1]


def test_a_commit_gives_up_at_its_deadline_naming_the_commit_and_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens: one warning while retrying, then one error naming the run, the step
    and the server, raised by the next flush."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    committer = CheckpointCommitter(
        url, "t", retry_for_s=0.5, client=lambda: APIClient(url, "t", backoff_s=0.01)
    )
    with caplog.at_level(logging.WARNING, logger="shardstream.api_client"):
        committer.submit(7, step=3, epoch=0, sample_in_epoch=4, plan={})
        with pytest.raises(
            ServerUnavailableError, match=rf"run 7 step 3 to {url} failed: .*did not answer"
        ):
            committer.flush(HANG_S)
    waiting = [r.getMessage() for r in caplog.records if r.name == "shardstream.api_client"]
    assert len(waiting) == 1 and url in waiting[0], waiting
    committer.close(HANG_S)


def test_commits_are_durable_when_the_process_exits(
    live_server: LiveServer, run_id: int, tmp_path: Path
) -> None:
    """A script that commits and ends without closing anything still leaves its commit on
    the server (2 s away through the proxy) before the process ends: the script's own
    exit hook, registered first so it runs last, finds it there."""
    where = urlsplit(live_server.url)
    script = textwrap.dedent(f"""
        import atexit
        def report():
            from shardstream.api_client import APIClient
            with APIClient({live_server.url!r}, {live_server.token!r}) as api:
                print("at exit:", [c.step for c in api.list_checkpoints({run_id})])
        atexit.register(report)
        from shardstream.client import ServerOptions, ShardstreamLoader, StreamingDataset
        from shardstream.client import CacheOptions
        server = ServerOptions(url={{url!r}}, token={live_server.token!r}, run={run_id})
        ds = StreamingDataset({str(tmp_path / "ds")!r}, 4, server=server,
                              cache=CacheOptions(dir={str(tmp_path / "cache")!r}))
        loader = ShardstreamLoader(ds, num_workers=0)
        next(iter(loader))
        loader.commit(4)
    """)
    with TCPGate((str(where.hostname), int(where.port or 80)), delay_s=2.0) as slow:
        done = subprocess.run(
            [sys.executable, "-c", script.format(url=slow.url)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert "at exit: [4]" in done.stdout


def test_an_unknown_run_is_refused_before_the_first_batch(
    live_server: LiveServer, run_id: int, tmp_path: Path
) -> None:
    """Not at the first commit, possibly hours into training: when the dataset is built."""
    missing = run_id + 1000
    for run in (missing, str(missing)):
        server = ServerOptions(url=live_server.url, token=live_server.token, run=run)
        with pytest.raises(ConfigError, match=rf"run {missing} on the server {live_server.url}"):
            StreamingDataset(str(tmp_path / "ds"), 4, server=server)
    with pytest.raises(ConfigError, match="numeric id"):
        StreamingDataset(
            str(tmp_path / "ds"), 4, server=ServerOptions(url=live_server.url, run="x")
        )
    known = ServerOptions(url=live_server.url, token=live_server.token, run=run_id)
    ds = StreamingDataset(
        str(tmp_path / "ds"), 4, server=known, cache=CacheOptions(dir=tmp_path / "c")
    )
    assert ds.num_batches > 0
