"""A failed build leaves no empty or half-written output behind that it made, and never
removes what was there before it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder import ImageBuildConfig, TextBuildConfig, build_images, build_text
from shardstream.shard_builder.pipeline import BuildRun, run_build
from shardstream.shard_builder.text import TextKind
from tests.builder.conftest import jpeg_bytes, make_docs, write_jsonl


def _text(output: Path, *inputs: Path, **kw: object) -> TextBuildConfig:
    opts: dict[str, object] = {
        "output": str(output),
        "inputs": tuple(str(i) for i in inputs),
        "seq_len": 16,
        "shard_size": 2048,
        "allow_small_shards": True,
        "workers": 1,
        "progress": False,
        "chunk_bytes": 1500,
    }
    opts.update(kw)
    return TextBuildConfig(**opts)  # type: ignore[arg-type]


def _bad_jsonl(tmp_path: Path) -> Path:
    path = write_jsonl(tmp_path / "d.jsonl", make_docs(300))
    lines = path.read_text().splitlines()
    lines[250] = '{"text": "unterminated'  # late: shards before it are written first
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_input_removes_the_output_folders_the_build_made(tmp_path: Path) -> None:
    out = tmp_path / "new" / "nested" / "out"
    with pytest.raises(InputError, match=r"d\.jsonl:251: invalid JSON"):
        build_text(_text(out, _bad_jsonl(tmp_path)))
    assert not (tmp_path / "new").exists()

    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        (root / "a" / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    (root / "a" / "3.jpg").write_bytes(b"not an image")
    config = ImageBuildConfig(
        output=str(tmp_path / "images"),
        inputs=(str(root),),
        shard_size=4096,
        allow_small_shards=True,
        workers=1,
        progress=False,
    )
    with pytest.raises(InputError, match="undecodable"):
        build_images(config)
    assert not (tmp_path / "images").exists()


def test_a_folder_that_was_there_stays(tmp_path: Path) -> None:
    bad = _bad_jsonl(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        build_text(_text(empty, bad))
    assert empty.is_dir() and list(empty.iterdir()) == []

    parent = tmp_path / "parent"
    parent.mkdir()
    with pytest.raises(InputError):
        build_text(_text(parent / "out", bad))
    assert parent.is_dir() and list(parent.iterdir()) == []

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not empty"):
        build_text(_text(mine, tmp_path / "d.jsonl"))
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


class _Interrupted(TextKind):
    """A text build stopped (as by a lost disk or Ctrl-C) when unit ``stop_at`` comes in."""

    stop_at = 0

    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        if number == self.stop_at:
            raise KeyboardInterrupt
        return super().add(run, number, result)


def test_an_interrupted_build_keeps_only_what_a_resume_uses(tmp_path: Path) -> None:
    docs = write_jsonl(tmp_path / "d.jsonl", make_docs(300))
    out = tmp_path / "new" / "out"
    # Stopped before any shard: nothing to resume from, so nothing is left.
    with pytest.raises(KeyboardInterrupt):
        run_build(_Interrupted(_text(out, docs)))
    assert not (tmp_path / "new").exists()
    # Stopped after shards were stored: they stay (no index.json) and a re-run reuses them.
    late = _Interrupted(_text(out, docs))
    late.stop_at = len(late.units) - 1
    with pytest.raises(KeyboardInterrupt):
        run_build(late)
    kept = sorted(p.name for p in out.iterdir())
    assert "index.json" not in kept and ".shardstream-build" in kept
    assert any(name.startswith("shard.") for name in kept)
    result = build_text(_text(out, docs))
    assert result.reused_shards >= 1
    assert json.loads((out / "index.json").read_text())["shards"]
