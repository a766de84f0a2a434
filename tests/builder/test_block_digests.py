"""The builder's shards carry per-block digests (the codec's default), images and text alike."""

from __future__ import annotations

from pathlib import Path

from shardstream.cli import main
from shardstream.mds import DEFAULT_BLOCK_SIZE, load_index, verify_range
from tests.builder.conftest import make_docs, write_jsonl


def _check(out: Path) -> int:
    index = load_index(out / "index.json")
    for shard in index.shards:
        digests = shard.block_digests
        assert digests is not None and digests.block_size == DEFAULT_BLOCK_SIZE
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
