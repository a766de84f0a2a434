"""Bad input and bad options: one clear error naming the file and line/row or setting.

After every failed build the output holds no ``index.json``: nothing looks complete.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder import ImageBuildConfig, TextBuildConfig, build_images, build_text
from shardstream.shard_builder.config import parse_size
from tests.builder.conftest import jpeg_bytes, make_docs, write_jsonl, write_parquet


def _text(tmp_path: Path, *inputs: Path | str, **kw: object) -> TextBuildConfig:
    opts: dict[str, object] = {
        "output": str(tmp_path / "out"),
        "inputs": tuple(str(i) for i in inputs),
        "seq_len": 16,
        "shard_size": 2048,
        "allow_small_shards": True,
        "workers": 1,
        "progress": False,
    }
    opts.update(kw)
    return TextBuildConfig(**opts)  # type: ignore[arg-type]


def _fails(config: TextBuildConfig, error: type[Exception], pattern: str) -> str:
    with pytest.raises(error, match=pattern) as info:
        build_text(config)
    assert not (Path(config.output) / "index.json").exists()
    return str(info.value)


@pytest.mark.parametrize("workers", [1, 2])
def test_malformed_json_line_names_file_and_line(tmp_path: Path, workers: int) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", make_docs(300))
    lines = path.read_text().splitlines()
    lines[236] = '{"text": "unterminated'
    path.write_text("\n".join(lines) + "\n")
    # Small chunks: the bad line sits in a later chunk, read by a worker process.
    config = _text(tmp_path, path, workers=workers, chunk_bytes=1500)
    _fails(config, InputError, rf"{re.escape(str(path.resolve()))}:237: invalid JSON")


def test_missing_field_and_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n\n{"body": "no text field"}\n')
    _fails(_text(tmp_path, path), InputError, r"d\.jsonl:3: no field 'text' \(found: body\)")
    path.write_text('{"text": "ok"}\n{"text": 12}\n')
    _fails(_text(tmp_path, path), InputError, r"d\.jsonl:2: field 'text' is int, not a string")


def test_unreadable_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    _fails(_text(tmp_path, bad), InputError, r"broken\.parquet: not a readable Parquet file")


def test_parquet_missing_column_and_null_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_parquet(tmp_path / "d.parquet", make_docs(10))
    _fails(_text(tmp_path, path, field="body"), InputError, r"d\.parquet: no column 'body'")
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), path, row_group_size=2)
    _fails(_text(tmp_path, path), InputError, r"d\.parquet: row 2: field 'text' is null")


def test_empty_input(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    _fails(
        _text(tmp_path, tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"),
        InputError,
        "no documents",
    )
    (tmp_path / "tiny.jsonl").write_text('{"text": "hi"}\n')
    _fails(_text(tmp_path, tmp_path / "tiny.jsonl"), InputError, "fewer than one sequence")
    _fails(_text(tmp_path, tmp_path / "nothing-*.jsonl"), InputError, "no input files found")
    _fails(_text(tmp_path, tmp_path / "missing.jsonl"), InputError, "no such file")


def test_tokenizer_that_does_not_load(tmp_path: Path, tokenizer_file: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(20))
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"version": "1.0", "model": {"type": "nonsense"}}')
    _fails(
        _text(tmp_path, tmp_path / "d.jsonl", tokenizer=broken),
        ConfigError,
        r"tokenizer\.json: tokenizer file does not load",
    )
    _fails(
        _text(tmp_path, tmp_path / "d.jsonl", tokenizer=tokenizer_file, eos_token="<nope>"),
        ConfigError,
        "no end-of-sequence token '<nope>'",
    )


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="outside the accepted range 64-256 MB"):
        TextBuildConfig(output="o", inputs=("x",), shard_size=parse_size("16MB"))
    with pytest.raises(ConfigError, match="compression 'gzip'"):
        TextBuildConfig(output="o", inputs=("x",), compression="gzip")
    with pytest.raises(ConfigError, match="cannot read size"):
        parse_size("lots")
    assert parse_size("128MB") == 128 << 20 == parse_size("128MiB")


def test_output_holding_something_else_is_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(100))
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _fails(
        _text(tmp_path, tmp_path / "d.jsonl"), ConfigError, r"is not empty \(it holds 'notes.txt'"
    )
    (out / "notes.txt").unlink()
    build_text(_text(tmp_path, tmp_path / "d.jsonl"))
    # Another build into the finished output needs --overwrite.
    with pytest.raises(ConfigError, match=r"already holds a finished dataset.*--overwrite"):
        build_text(_text(tmp_path, tmp_path / "d.jsonl", seq_len=8))
    result = build_text(_text(tmp_path, tmp_path / "d.jsonl", seq_len=8, overwrite=True))
    assert result.columns == {"tokens": "ndarray:uint16:8"}
    assert json.loads((out / "shardstream.json").read_text())["seq_len"] == 8


def _images(tmp_path: Path, root: Path, **kw: object) -> ImageBuildConfig:
    opts: dict[str, object] = {
        "output": str(tmp_path / "out"),
        "inputs": (str(root),),
        "shard_size": 4096,
        "allow_small_shards": True,
        "workers": 1,
        "progress": False,
    }
    opts.update(kw)
    return ImageBuildConfig(**opts)  # type: ignore[arg-type]


def test_bad_images_fail_or_are_skipped_and_reported(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    for i in range(6):
        (root / "a" / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    truncated = jpeg_bytes(99)
    (root / "a" / "3.jpg").write_bytes(truncated[: len(truncated) // 2])
    (root / "a" / "5.jpg").write_bytes(b"not an image")
    with pytest.raises(
        InputError, match=r"2 undecodable image\(s\): .*a/3\.jpg: .*a/5\.jpg"
    ) as info:
        build_images(_images(tmp_path, root))
    assert "--on-bad-image skip" in str(info.value)
    assert not (tmp_path / "out" / "index.json").exists()

    result = build_images(_images(tmp_path, root, on_bad_image="skip", overwrite=True))
    assert result.samples == 4
    assert [Path(b.source).name for b in result.skipped] == ["3.jpg", "5.jpg"]
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert [Path(b["source"]).name for b in meta["skipped"]] == ["3.jpg", "5.jpg"]


def test_skip_bad_images_on_the_command_line_counts_and_names_them(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        (root / "a" / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    (root / "a" / "2.jpg").write_bytes(b"not an image")
    args = [sys.executable, "-m", "shardstream", "build", "images", str(root)]
    args += ["--output", str(tmp_path / "out"), "--skip-bad-images", "--no-progress"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "3 samples" in done.stderr and "1 bad inputs skipped" in done.stderr
    assert f"skipped {root / 'a' / '2.jpg'}:" in done.stderr
