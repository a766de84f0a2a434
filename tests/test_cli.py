"""The ``shardstream`` command line reports a user's mistakes in one line, no traceback:
a path the operating system refuses, an option spelled almost right."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.client.cache.shard_cache import ShardCache


def _shardstream(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_bad_output_path_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text('{"text": "hello world"}\n')
    # The output folder would be inside a file.
    done = _shardstream(
        "build",
        "text",
        "corpus.jsonl",
        "--output",
        "corpus.jsonl/out",
        "--no-progress",
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["shardstream: error: Not a directory: corpus.jsonl/out"], done.stderr


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["build", "text", "corpus.jsonl", "--seqlen", "64", "-o", "out"], "--seq-len"),
        (["build", "text", "corpus.jsonl", "--seqlen=64", "-o", "out"], "--seq-len"),
        (["--verbse", "cache", "stats", "cache-dir"], "--verbose"),
        (["server", "migrate", "--databse-url", "sqlite://"], "--database-url"),
    ],
)
def test_a_mistyped_option_names_the_right_one(tmp_path: Path, args: list[str], hint: str) -> None:
    done = _shardstream(*args, cwd=tmp_path)
    assert done.returncode == 2
    last = done.stderr.splitlines()[-1]
    assert "error: unrecognized arguments: " in last
    assert last.endswith(f"(did you mean {hint}?)"), done.stderr
    assert "Traceback" not in done.stderr


def test_an_unknown_option_gets_no_wild_guess(tmp_path: Path) -> None:
    done = _shardstream("build", "text", "corpus.jsonl", "--bogus", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("error: unrecognized arguments: --bogus")


def _into_closed_pipe(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``shardstream ARGS`` with stdout a pipe whose reader is already gone (what
    ``| head`` leaves once it has its lines); returns (status, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "shardstream", *args],
            cwd=cwd,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            env=env,
        )
    finally:
        os.close(write_end)
    return done.returncode, done.stderr


def test_a_reader_gone_ends_the_command_quietly(tmp_path: Path) -> None:
    ShardCache(tmp_path / "cache")
    for args in (["cache", "stats", "cache"], ["cache", "stats", "--json", "cache"]):
        status, stderr = _into_closed_pipe(*args, cwd=tmp_path)
        assert (status, stderr) == (128 + signal.SIGPIPE, ""), (args, stderr)


def test_cache_commands_default_to_the_readers_cache_folder(tmp_path: Path) -> None:
    env = {**os.environ, "SHARDSTREAM_CACHE_DIR": str(tmp_path / "mine")}
    cache = ShardCache(tmp_path / "mine", limit_bytes=1 << 20)
    with cache.lease("v/a.mds", lambda p: p.write_bytes(b"x" * 100), size=100):
        pass
    done = _shardstream_env(["cache", "stats", "--json"], cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["dir"], report["entries"], report["limit_bytes"]) == (
        str(tmp_path / "mine"),
        1,
        1 << 20,
    )
    # Without SHARDSTREAM_CACHE_DIR: the temp folder's default, named when it is missing.
    env.pop("SHARDSTREAM_CACHE_DIR")
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    done = _shardstream_env(["cache", "prune", "--limit", "1G"], cwd=tmp_path, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    default = tmp_path / "tmp" / f"shardstream-cache-{os.getuid()}"
    assert done.stderr.strip() == (
        f"shardstream: error: {default} is no shardstream cache yet (it has no data/ folder); "
        "give the folder your readers use (CacheOptions.dir), or set SHARDSTREAM_CACHE_DIR to it"
    )
    ShardCache(default)
    done = _shardstream_env(["cache", "prune", "--limit", "1G"], cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.startswith("evicted 0 shards"), done.stderr


def _shardstream_env(
    args: list[str], *, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardstream", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
