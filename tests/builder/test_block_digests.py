"""The builder's shards carry per-block digests (the codec's default), images and text alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardstream.cli import main
from shardstream.mds import DEFAULT_BLOCK_SIZE, PieceTable, load_index, verify_range
from tests.builder.conftest import make_docs, write_jsonl


def _check(out: Path, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    index = load_index(out / "index.json")
    for shard in index.shards:
        digests = shard.block_digests
        assert digests is not None and digests.block_size == block_size
        assert digests.file_size == shard.raw_data.bytes
        verify_range(shard, 0, (out / shard.raw_data.basename).read_bytes())
    return len(index.shards)


def test_built_shards_have_block_digests(tmp_path: Path, image_folder: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(200, seed=2))
    rc = main(
        [
            "build", "text", str(tmp_path / "d.jsonl"), "--seq-len", "16",
            "-o", str(tmp_path / "text"), "--shard-size", "2KB", "--allow-small-shards",
            "--workers", "1", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0 and _check(tmp_path / "text") > 1
    rc = main(
        [
            "build", "images", str(image_folder), "-o", str(tmp_path / "img"),
            "--shard-size", "16KB", "--allow-small-shards", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0 and _check(tmp_path / "img") > 1


def test_block_size_is_an_option_and_part_of_the_build(tmp_path: Path, capsys: Any) -> None:
    """``--block-size`` sets the digest blocks (a finer fetch unit for ranged readers); a
    re-run into the same output with another block size is refused, not mixed; a bad
    size is one error line."""
    write_jsonl(tmp_path / "d.jsonl", make_docs(400, seed=3))
    args = [
        "build", "text", str(tmp_path / "d.jsonl"), "--seq-len", "16", "-o",
        str(tmp_path / "text"), "--shard-size", "300KB", "--allow-small-shards",
        "--workers", "1", "--no-progress",
    ]  # fmt: skip
    assert main([*args, "--block-size", "64KiB"]) == 0
    assert _check(tmp_path / "text", 64 << 10) >= 1
    shard = load_index(tmp_path / "text" / "index.json").shards[0]
    assert shard.block_digests is not None and shard.block_digests.num_blocks > 1
    assert main([*args, "--block-size", "128KiB"]) != 0  # another build's journal is there
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--block-size", "1KB"]) == 1
    assert "block size 1024 is outside the accepted range" in capsys.readouterr().err


def test_piece_size_is_an_option_and_part_of_the_build(tmp_path: Path, capsys: Any) -> None:
    """``--piece-size`` sets the piece table in each shard header (a cold reader's first
    batches verify 64 KiB pieces, not whole blocks): every piece of every shard matches it;
    ``none`` writes none; another piece size into the same output is refused; a bad size is
    one error line."""
    write_jsonl(tmp_path / "d.jsonl", make_docs(400, seed=4))
    args = [
        "build", "text", str(tmp_path / "d.jsonl"), "--seq-len", "16", "--shard-size",
        "300KB", "--allow-small-shards", "--workers", "1", "--no-progress",
    ]  # fmt: skip
    assert main([*args, "-o", str(tmp_path / "p"), "--piece-size", "8KiB"]) == 0
    for shard in load_index(tmp_path / "p" / "index.json").shards:
        spec = shard.piece_spec
        assert spec is not None and spec.piece_size == 8 << 10 and spec.pieces > 1
        data = (tmp_path / "p" / shard.raw_data.basename).read_bytes()
        table = PieceTable(spec, data[: spec.data_start], len(data), shard.raw_data.basename)
        table.verify(0, data[slice(*table.span(0, spec.pieces - 1))])
    assert main([*args, "-o", str(tmp_path / "p"), "--piece-size", "16KiB"]) != 0
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "-o", str(tmp_path / "n"), "--piece-size", "none"]) == 0
    assert all(s.piece_spec is None for s in load_index(tmp_path / "n" / "index.json").shards)
    capsys.readouterr()
    assert main([*args, "-o", str(tmp_path / "x"), "--piece-size", "1KB"]) == 1
    err = capsys.readouterr().err
    assert "piece size 1024 is outside the accepted range" in err
    assert len(err.strip().splitlines()) == 1
