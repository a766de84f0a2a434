"""The shared HTTP client against a live server: every endpoint, errors, retries, ETags."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import httpx
import pytest

from shardstream.api_client import APIClient
from shardstream.errors import (
    AuthenticationError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    RequestValidationError,
    ServerUnavailableError,
)
from shardstream.retry import RetryPolicy
from shardstream.wire import ShardRecord
from tests.fixtures.server import LiveServer


def _records(root: Path, n: int) -> list[ShardRecord]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        (root / f"s{i}.mds").write_bytes(b"y" * (i + 1))
        out.append(
            ShardRecord(index=i, key=f"s{i}.mds", samples=2, raw_bytes=i + 1, stored_bytes=i + 1)
        )
    return out


def test_full_lifecycle(live: LiveServer, tmp_path: Path) -> None:
    with APIClient(live.url, live.token) as api:
        assert api.healthz()
        assert api.whoami()["scope"] == "admin"
        api.ensure_dataset("wiki", description="text")
        assert api.ensure_dataset("wiki").description == "text"
        root = tmp_path / "v1"
        draft = api.create_version("wiki", {"x": "int"}, storage_root=root.as_uri())
        records = _records(root, 12)
        assert api.add_shards("wiki", draft.number, records).num_shards == 12
        published = api.publish_version("wiki", draft.number)
        assert (published.status, published.total_bytes) == ("published", sum(range(1, 13)))
        assert api.latest_version("wiki").number == draft.number
        assert [s.key for s in api.iter_shards("wiki", 1, page_size=5)] == [r.key for r in records]
        assert api.get_version("wiki", 1) == api.get_version("wiki", 1)  # second one via 304
        urls = api.presign("wiki", 1, ["s0.mds", "s3.mds"])
        assert urls["s3.mds"].startswith("file://")
        assert [d.name for d in api.list_datasets()] == ["wiki"]
        assert [v.number for v in api.list_versions("wiki")] == [1]

        run = api.create_run([("wiki", 1, 2.0)], global_batch_size=64, seed=3, name="r1")
        assert api.get_run(run.id).sources[0].weight == 2.0
        assert api.latest_checkpoint(run.id) is None
        c = api.commit_checkpoint(run.id, step=10, epoch=0, sample_in_epoch=640, plan={"p": 8})
        assert (
            api.commit_checkpoint(run.id, step=10, epoch=0, sample_in_epoch=640, plan={"p": 8}) == c
        )
        with pytest.raises(ConflictError, match="step 10"):
            api.commit_checkpoint(run.id, step=10, epoch=0, sample_in_epoch=1)
        with pytest.raises(ConflictError, match="lower than"):
            api.commit_checkpoint(run.id, step=5, epoch=0, sample_in_epoch=1)
        assert api.latest_checkpoint(run.id) == api.get_checkpoint(run.id, 10)
        assert [x.step for x in api.list_checkpoints(run.id)] == [10]
        assert [r.id for r in api.list_runs()] == [run.id]
        with pytest.raises(ConflictError, match="force"):
            api.delete_dataset("wiki")
        assert api.set_run_status(run.id, "completed").status == "completed"
        api.delete_dataset("wiki")
        with pytest.raises(NotFoundError, match="wiki"):
            api.get_dataset("wiki")
        with pytest.raises(NotFoundError):
            api.latest_checkpoint(999)


def test_error_mapping_and_tokens(live: LiveServer) -> None:
    with APIClient(live.url, live.token) as admin:
        reader = admin.create_token("reader", ["read"])
        assert reader.secret
        with (
            APIClient(live.url, reader.secret) as api,
            pytest.raises(PermissionDeniedError, match="write"),
        ):
            api.create_dataset("x")
        with pytest.raises(RequestValidationError, match=r"body\.name"):
            admin.request("POST", "/v1/datasets", json={"name": "BAD"})
        assert [t.name for t in admin.list_tokens()] == ["reader"]
        admin.revoke_token(reader.id)
        with (
            APIClient(live.url, reader.secret) as api,
            pytest.raises(AuthenticationError, match="revoked"),
        ):
            api.list_datasets().__next__()
    with APIClient(live.url, token="") as anon, pytest.raises(AuthenticationError):
        anon.whoami()


def test_environment_defaults(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDSTREAM_SERVER", live.url)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live.token)
    with APIClient() as api:
        assert api.whoami()["scope"] == "admin"
    monkeypatch.delenv("SHARDSTREAM_SERVER")
    with pytest.raises(ConfigError, match="SHARDSTREAM_SERVER"):
        APIClient()


def test_retries_until_the_server_comes_up(live: LiveServer) -> None:
    """Connection refused is retried; a server appearing meanwhile is reached."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with APIClient(f"http://127.0.0.1:{port}", "t", retries=2, backoff_s=0.01) as api:
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="did not answer after 3 attempts"):
            api.whoami()
        assert time.monotonic() - start < 5


def test_a_dead_server_is_named_while_retrying_and_in_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens: one warning at the first failure says what the retries wait for (the
    server's URL, how many more, for how long), and the final error names the server, the time
    spent and the settings that change it; not a silent wait of several seconds."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    with (
        caplog.at_level(logging.WARNING, logger="shardstream.api_client"),
        APIClient(url, "t", retries=3, backoff_s=0.01) as api,
        pytest.raises(ServerUnavailableError) as raised,
    ):
        api.whoami()
    waiting = [r.getMessage() for r in caplog.records if r.name == "shardstream.api_client"]
    assert len(waiting) == 1, waiting
    assert url in waiting[0] and "retrying 3 more times" in waiting[0]
    message = str(raised.value)
    assert f"runs at {url}" in message and "SHARDSTREAM_SERVER" in message
    assert "after 4 attempts in" in message and "retries=" in message


def test_retries_503_then_succeeds(live: LiveServer) -> None:
    """502/503/504 are retried with backoff; the final answer is used (transport-level)."""
    answers = iter([503, 502, 200])
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        status = next(answers)
        body = (
            {"name": "x", "scope": "read", "datasets": None}
            if status == 200
            else {"detail": "busy"}
        )
        return httpx.Response(status, json=body)

    with APIClient(live.url, "t", backoff_s=0.01, transport=httpx.MockTransport(handler)) as api:
        assert api.whoami()["name"] == "x"
    assert calls == ["/v1/whoami"] * 3
    always = httpx.MockTransport(lambda r: httpx.Response(503, json={"detail": "db down"}))
    with (
        APIClient(live.url, "t", retries=1, backoff_s=0.01, transport=always) as api,
        pytest.raises(ServerUnavailableError, match="db down"),
    ):
        api.whoami()


def test_one_policy_with_a_deadline_retries_past_the_usual_attempts(live: LiveServer) -> None:
    """Retries are the session's setting: ``with_retry`` gives the same pool under another
    :class:`RetryPolicy` (here: no bound on attempts, a deadline instead), the one loop the
    checkpoint committer relies on; the usual client gives up after its attempts."""
    answers = iter([503] * 8 + [200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        body = {"name": "x", "scope": "read", "datasets": None}
        return httpx.Response(status, json=body if status == 200 else {"detail": "restarting"})

    with APIClient(live.url, "t", backoff_s=0.001, transport=httpx.MockTransport(handler)) as api:
        with pytest.raises(ServerUnavailableError, match="restarting"):
            api.whoami()  # 6 attempts: 503 each time
        patient = api.with_retry(
            RetryPolicy(attempts=None, base_s=0.001, cap_s=0.01, within_s=600.0)
        )
        assert patient.whoami()["name"] == "x"  # 3 more 503s, then the answer
        assert patient.retry.within_s == 600.0 and api.retry.attempts == 6
    assert patient._http.is_closed  # one pool: closing the client closes the view's


def test_retry_settings_are_given_one_way() -> None:
    with pytest.raises(ConfigError, match="either retry=RetryPolicy"):
        APIClient("http://127.0.0.1:9", "t", retries=2, retry=RetryPolicy(attempts=3))
    with pytest.raises(ConfigError, match="retries must be an int >= 0, got -1"):
        APIClient("http://127.0.0.1:9", "t", retries=-1)
