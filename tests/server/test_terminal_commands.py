"""``shardstream datasets|runs|tokens`` against a running server: tables, ``--json``, the
environment as the SDK reads it, and a restricted token seeing only its datasets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.api_client import APIClient
from shardstream.cli import main
from tests.fixtures.run_requests import publish_ints
from tests.fixtures.server import LiveServer


def test_terminal_commands_show_what_the_token_may_read(
    live_server: LiveServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SHARDSTREAM_SERVER", live_server.url)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient() as api:
        for name in ("alpha", "beta"):
            publish_ints(api, live_server.storage_root, name)
        run = api.create_run([("alpha", 1)], global_batch_size=8, seed=3, name="r1")
        api.commit_checkpoint(run.id, step=10, epoch=0, sample_in_epoch=80)
    capsys.readouterr()

    assert main(["datasets", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "NUM_VERSIONS", "LATEST_PUBLISHED"]
    assert [line.split()[0] for line in table[1:]] == ["alpha", "beta"]

    assert main(["datasets", "show", "alpha@1", "--json"]) == 0
    version = json.loads(capsys.readouterr().out)
    assert (version["dataset"], version["number"], version["status"]) == ("alpha", 1, "published")
    assert version["total_samples"] == 300

    assert main(["runs", "show", str(run.id)]) == 0
    shown = capsys.readouterr().out
    assert "alpha@1" in shown and "STEP" in shown and "ago" in shown

    assert main(["tokens", "create", "reader", "--scope", "read", "--dataset", "beta"]) == 0
    secret = capsys.readouterr().out.splitlines()[-1]
    assert secret.startswith("ss_")
    # The restricted token sees beta only, and no runs of alpha.
    assert main(["datasets", "list", "--json", "--token", secret]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == ["beta"]
    assert main(["runs", "list", "--json", "--token", secret]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["tokens", "list", "--token", secret]) == 1  # admins only: one clear error
    assert "admin" in capsys.readouterr().err

    assert main(["tokens", "list", "--json"]) == 0
    tokens = json.loads(capsys.readouterr().out)
    reader = next(t for t in tokens if t["name"] == "reader")
    assert reader["secret"] is None and reader["datasets"] == ["beta"]
    assert main(["tokens", "revoke", str(reader["id"])]) == 0
    assert "revoked_at" in capsys.readouterr().out
    assert main(["datasets", "list", "--token", secret]) == 1  # a revoked token is refused


def test_runs_show_into_a_closed_pipe_ends_quietly(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shardstream runs show N | head``: once the reader is gone, the command stops like
    a Unix tool (status 141, SIGPIPE's), with no BrokenPipeError traceback."""
    monkeypatch.setenv("SHARDSTREAM_SERVER", live_server.url)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient() as api:
        publish_ints(api, live_server.storage_root, "alpha")
        run = api.create_run([("alpha", 1)], global_batch_size=8, seed=3, name="r1")
        for step in range(1, 4):
            api.commit_checkpoint(run.id, step=step * 10, epoch=0, sample_in_epoch=step * 80)
    read_end, write_end = os.pipe()
    os.close(read_end)  # what `| head` leaves once it has its lines
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardstream", "runs", "show", str(run.id)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")
