"""Hostile text input for ``shardstream build text``: a lone surrogate or JSON nested past
any reasonable depth is one error naming the file and line, and the build leaves nothing
behind (no shards, no journal, no staging folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.builder.conftest import make_docs, write_jsonl

LINES = {
    # "\ud800" is valid JSON text but no Unicode text: tokenizing it failed in the encoder.
    "lone-surrogate": r'{"text": "before \ud800 after"}',
    # json.loads recurses once per level: a RecursionError from the parser.
    "deep-json": '{"text": "x", "n": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("case", sorted(LINES))
@pytest.mark.parametrize("workers", ["1", "2"])
def test_hostile_json_line_is_one_error_and_nothing_is_left(
    tmp_path: Path, case: str, workers: str
) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", make_docs(40))
    lines = path.read_text().splitlines()
    lines[6] = LINES[case]
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "shardstream", "build", "text", str(path), "--seq-len", "16",
               "--output", str(out), "--workers", workers, "--no-progress"]  # fmt: skip
    run = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    lines_out = run.stderr.strip().splitlines()
    assert len(lines_out) == 1 and "Traceback" not in run.stderr, run.stderr
    assert f"{path.resolve()}:7: " in lines_out[0], lines_out[0]
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
