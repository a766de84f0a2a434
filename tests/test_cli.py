"""The ``shardstream`` command line reports a user's mistakes in one line, no traceback:
a path the operating system refuses, an option spelled almost right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


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
