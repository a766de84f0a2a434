"""``build text --skip-bad``: bad lines left out, counted, the first few named with
file:line (Parquet: row); without it the first bad line is one error naming file and line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder import TextBuildConfig, build_text
from shardstream.shard_builder.pipeline import BuildRun, run_build
from shardstream.shard_builder.text import TextKind
from tests.builder.conftest import encode_reference, make_docs, read_with_ours, write_jsonl

BAD = {  # line index -> what is wrong with it
    3: '{"text": "unterminated',
    40: '{"body": "no text field"}',
    41: '{"text": 12}',
    42: "[1, 2, 3]",
    **{i: "not json at all" for i in range(100, 112)},  # more than are named
    250: '{"text": "\\ud800 lone"}',
}


def _corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    """A JSONL file with the bad lines above among good documents; the good ones."""
    docs = make_docs(300)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    lines = path.read_text().splitlines()
    for at, line in BAD.items():
        lines[at] = line
    path.write_text("\n".join(lines) + "\n")
    return path, [doc for i, doc in enumerate(docs) if i not in BAD]


def _config(tmp_path: Path, *inputs: Path, **kw: object) -> TextBuildConfig:
    opts: dict[str, object] = {
        "output": str(tmp_path / "out"),
        "inputs": tuple(str(i) for i in inputs),
        "seq_len": 16,
        "shard_size": 2048,
        "allow_small_shards": True,
        "workers": 2,
        "progress": False,
        "chunk_bytes": 1500,  # many chunks: bad lines in several, read by worker processes
    }
    opts.update(kw)
    return TextBuildConfig(**opts)  # type: ignore[arg-type]


def _tokens(out: Path) -> np.ndarray:
    return np.concatenate([np.asarray(s["tokens"]) for s in read_with_ours(out)])


def test_without_skip_bad_the_first_bad_line_is_the_error(tmp_path: Path) -> None:
    path, _ = _corpus(tmp_path)
    with pytest.raises(InputError, match=rf"{re.escape(str(path.resolve()))}:4: invalid JSON"):
        build_text(_config(tmp_path, path))


def test_skip_bad_leaves_out_counts_and_names_the_first(tmp_path: Path) -> None:
    path, good = _corpus(tmp_path)
    result = build_text(_config(tmp_path, path, skip_bad=True))
    expected = encode_reference(None, good)
    stored = _tokens(tmp_path / "out")
    assert np.array_equal(stored, expected[: len(stored)])  # only the good documents
    assert result.documents == len(good)
    assert "17 bad inputs skipped (the first 10 named below)" in result.summary()
    where = [b.source.rsplit(":", 1)[1] for b in result.skipped]
    assert where == ["4", "41", "42", "43", *[str(n) for n in range(101, 107)]]
    assert "invalid JSON" in result.skipped[0].reason
    assert "no field 'text'" in result.skipped[1].reason
    assert "is int, not a string" in result.skipped[2].reason
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert meta["skipped_count"] == 17 and len(meta["skipped"]) == 10
    assert meta["skipped"][0]["source"] == f"{path.resolve()}:4"


class _Killed(TextKind):
    """A build stopped, as by a kill, when the last chunk comes in (shards are stored)."""

    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        if number == len(self.units) - 1:
            raise KeyboardInterrupt
        return super().add(run, number, result)


def test_a_resumed_build_reports_what_an_uninterrupted_one_does(tmp_path: Path) -> None:
    path, _ = _corpus(tmp_path)
    whole = build_text(_config(tmp_path / "whole", path, skip_bad=True))
    config = _config(tmp_path / "resumed", path, skip_bad=True)
    with pytest.raises(KeyboardInterrupt):
        run_build(_Killed(config))
    resumed = build_text(config)
    assert resumed.reused_shards >= 1
    assert resumed.skipped == whole.skipped
    assert resumed.metadata["skipped_count"] == whole.metadata["skipped_count"] == 17
    assert np.array_equal(
        _tokens(tmp_path / "resumed" / "out"), _tokens(tmp_path / "whole" / "out")
    )


def test_parquet_null_rows_are_skipped_by_row(tmp_path: Path) -> None:
    docs: list[str | None] = list(make_docs(120))
    docs[7] = docs[70] = None
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": docs}), path, row_group_size=50)
    with pytest.raises(InputError, match=r"d\.parquet: row 7: field 'text' is null"):
        build_text(_config(tmp_path, path))
    result = build_text(_config(tmp_path, path, skip_bad=True))
    assert [b.source for b in result.skipped] == [f"{path.resolve()}: row {n}" for n in (7, 70)]
    assert result.documents == 118


def test_skip_bad_on_the_command_line(tmp_path: Path) -> None:
    path, _ = _corpus(tmp_path)
    args = [sys.executable, "-m", "shardstream", "build", "text", str(path), "--skip-bad"]
    args += ["--output", str(tmp_path / "out"), "--seq-len", "16", "--no-progress"]
    args += ["--shard-size", "4096", "--allow-small-shards", "--workers", "1"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "17 bad inputs skipped" in done.stderr
    assert f"skipped {path.resolve()}:4: invalid JSON" in done.stderr


def test_skip_bad_is_refused_where_it_does_not_work_yet(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not with --documents"):
        _config(tmp_path, tmp_path / "d.jsonl", skip_bad=True, documents=True)
    from shardstream.shard_builder.cluster import build_text_on_ray

    with pytest.raises(ConfigError, match="not available with --ray"):  # before Ray starts
        build_text_on_ray(_config(tmp_path, tmp_path / "d.jsonl", skip_bad=True))
