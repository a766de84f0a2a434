"""Per-block digests: written by our writers, read by MosaicML, and catching every bad block."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import streaming
import xxhash

from shardstream.errors import ConfigError, CorruptShardError, FormatError
from shardstream.mds import (
    DEFAULT_BLOCK_SIZE,
    MDSWriter,
    ShardInfo,
    blocks_for_range,
    load_index,
    verify_range,
    write_shard_arrays,
)
from tests.mds.conftest import ALL_COLUMNS, FIXED_COLUMNS, assert_sample_equal, make_fixed

BLOCK = 4096


def write_dataset(root: Path, samples: list[dict[str, Any]], **kwargs: Any) -> list[ShardInfo]:
    with MDSWriter(root, ALL_COLUMNS, size_limit=60_000, block_size=BLOCK, **kwargs) as writer:
        for sample in samples:
            writer.write(sample)
    return load_index(root / "index.json").shards


def biggest(shards: list[ShardInfo]) -> ShardInfo:
    """The largest shard (at least 4 blocks)."""
    shard = max(shards, key=lambda s: s.raw_data.bytes)
    assert shard.raw_data.bytes > 4 * BLOCK
    return shard


def test_digests_recorded_for_every_block(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    shards = write_dataset(tmp_path, samples)
    assert len(shards) > 1
    for shard in shards:
        data = (tmp_path / shard.raw_data.basename).read_bytes()
        digests = shard.block_digests
        assert digests is not None
        assert (digests.algo, digests.block_size, digests.file_size) == (
            "xxh3_64",
            BLOCK,
            len(data),
        )
        expected = [
            xxhash.xxh3_64_hexdigest(data[i : i + BLOCK]) for i in range(0, len(data), BLOCK)
        ]
        assert digests.digests == expected and digests.num_blocks == len(expected) > 1
        assert shard.raw_data.hashes["blocks:xxh3_64:4096"] == "".join(expected)
        verify_range(shard, 0, data)  # the whole file, block by block


def test_default_block_size_and_none(tmp_path: Path) -> None:
    arrays = make_fixed(50)
    info = write_shard_arrays(tmp_path, "shard.00000.mds", FIXED_COLUMNS, arrays)
    assert info.block_digests is not None and info.block_digests.block_size == DEFAULT_BLOCK_SIZE
    assert info.block_digests.num_blocks == 1
    plain = write_shard_arrays(tmp_path, "shard.00001.mds", FIXED_COLUMNS, arrays, block_size=None)
    assert plain.block_digests is None and set(plain.raw_data.hashes) == {"sha1", "xxh3_64"}
    zipped = write_shard_arrays(tmp_path, "s.mds", FIXED_COLUMNS, arrays, compression="zstd")
    assert zipped.block_digests is None
    assert zipped.zip_data is not None
    assert not any(k.startswith("blocks:") for k in zipped.raw_data.hashes)
    with pytest.raises(ConfigError, match="block_size"):
        write_shard_arrays(tmp_path, "x.mds", FIXED_COLUMNS, arrays, block_size=100)


@pytest.mark.parametrize("validate_hash", [None, "xxh3_64", "sha1"])
def test_streaming_reads_shards_with_block_digests(
    tmp_path: Path, samples: list[dict[str, Any]], validate_hash: str | None
) -> None:
    """The real mosaicml-streaming accepts the index and reads every sample, hashes checked."""
    shards = write_dataset(tmp_path / "ds", samples)
    assert all(s.block_digests is not None for s in shards)
    dataset = streaming.StreamingDataset(
        remote=str(tmp_path / "ds"),
        local=str(tmp_path / "cache"),
        shuffle=False,
        batch_size=1,
        validate_hash=validate_hash,
    )
    got = [dataset[i] for i in range(len(dataset))]
    assert len(got) == len(samples)
    for theirs, mine in zip(got, samples, strict=True):
        assert_sample_equal(theirs, mine)


def test_blocks_for_range_aligns(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    shard = biggest(write_dataset(tmp_path, samples))
    size = shard.raw_data.bytes
    assert size > 3 * BLOCK
    assert blocks_for_range(shard, 0, 1) == (0, 0, 0, BLOCK)
    assert blocks_for_range(shard, BLOCK - 1, BLOCK + 1) == (0, 1, 0, 2 * BLOCK)
    assert blocks_for_range(shard, BLOCK, 2 * BLOCK) == (1, 1, BLOCK, 2 * BLOCK)
    last = (size - 1) // BLOCK
    assert blocks_for_range(shard, size - 1, size) == (last, last, last * BLOCK, size)
    for bad in [(5, 5), (-1, 3), (7, 2)]:
        with pytest.raises(ConfigError):
            blocks_for_range(shard, *bad)
    with pytest.raises(CorruptShardError, match=shard.raw_data.basename):
        blocks_for_range(shard, 0, size + 1)


def test_every_sample_range_verifies(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    """What a ranged reader does: per sample, fetch the aligned blocks and verify them."""
    for shard in write_dataset(tmp_path, samples):
        data = (tmp_path / shard.raw_data.basename).read_bytes()
        offsets = np.frombuffer(data, "<u4", shard.samples + 1, 4)
        for begin, end in itertools.pairwise(offsets):
            r = blocks_for_range(shard, int(begin), int(end))
            assert r.start <= begin and end <= r.end
            verify_range(shard, r.start, memoryview(data)[r.start : r.end])


def test_verify_range_names_the_bad_block(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    shard = biggest(write_dataset(tmp_path, samples))
    data = bytearray((tmp_path / shard.raw_data.basename).read_bytes())
    data[2 * BLOCK + 17] ^= 0x01
    verify_range(shard, 0, data[: 2 * BLOCK])  # blocks 0-1 are intact
    pattern = rf"shard {shard.raw_data.basename}: block 2 \(bytes {2 * BLOCK}-{3 * BLOCK}\)"
    with pytest.raises(CorruptShardError, match=pattern):
        verify_range(shard, BLOCK, data[BLOCK : 4 * BLOCK])
    with pytest.raises(CorruptShardError, match="block 2"):
        verify_range(shard, 0, data)
    zeroed = bytearray(data[:BLOCK])
    zeroed[100:200] = bytes(100)
    with pytest.raises(CorruptShardError, match="block 0"):
        verify_range(shard, 0, zeroed)


def test_verify_range_refuses_misaligned_or_overlong(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    (shard, *_) = write_dataset(tmp_path, samples)
    data = (tmp_path / shard.raw_data.basename).read_bytes()
    with pytest.raises(ConfigError, match="multiple of the block size"):
        verify_range(shard, 1, data[1:BLOCK])
    with pytest.raises(ConfigError, match="ends inside block"):
        verify_range(shard, 0, data[: BLOCK + 5])
    with pytest.raises(CorruptShardError, match="past the end"):
        verify_range(shard, 0, data + b"x")
    verify_range(shard, 0, b"")  # nothing to check


def test_compressed_shard_has_no_ranges(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    (shard, *_) = write_dataset(tmp_path, samples, compression="zstd")
    assert shard.block_digests is None
    with pytest.raises(ConfigError, match="no per-block digests"):
        blocks_for_range(shard, 0, 10)
    with pytest.raises(ConfigError, match="no per-block digests"):
        verify_range(shard, 0, b"abc")


def _edit_digests(root: Path, key: str | None, value: Any) -> None:
    obj = json.loads((root / "index.json").read_text())
    hashes = obj["shards"][0]["raw_data"]["hashes"]
    old = next(k for k in hashes if k.startswith("blocks:"))
    digests = hashes.pop(old)
    hashes[key or old] = digests if value is None else value
    (root / "index.json").write_text(json.dumps(obj))


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("blocks:md6:4096", None, "unknown algorithm"),
        ("blocks:xxh3_64:0", None, "block size"),
        ("blocks:xxh3_64:x", None, "block size"),
        ("blocks:xxh3_64:8192", None, "characters, expected"),
        (None, "abc", "characters, expected"),
    ],
)
def test_malformed_digests_are_format_errors(
    tmp_path: Path, samples: list[dict[str, Any]], key: str | None, value: Any, match: str
) -> None:
    write_dataset(tmp_path, samples)
    _edit_digests(tmp_path, key, value)
    with pytest.raises(FormatError, match=rf"shard 0 \(shard.00000.mds\): raw_data: .*{match}"):
        load_index(tmp_path / "index.json")


def test_non_hex_digest_blames_the_index(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    (shard, *_) = write_dataset(tmp_path, samples)
    assert shard.block_digests is not None
    _edit_digests(tmp_path, None, "z" * len(shard.block_digests.hex))
    (bad, *_) = load_index(tmp_path / "index.json").shards
    data = (tmp_path / shard.raw_data.basename).read_bytes()
    with pytest.raises(FormatError, match="not lowercase hex") as err:
        verify_range(bad, 0, data[:BLOCK])
    assert not isinstance(err.value, CorruptShardError)


def test_header_digest_covers_exactly_the_header(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    for shard in write_dataset(tmp_path, samples):
        data = (tmp_path / shard.raw_data.basename).read_bytes()
        head = shard.header_digest
        assert head is not None
        assert head.length == int.from_bytes(data[4:8], "little")  # the first sample offset
        assert shard.raw_data.hashes[f"header:xxh3_64:{head.length}"] == head.hex
        head.verify(data[: head.length], "x")
        assert f"header:xxh3_64:{head.length}" not in shard.raw_data.file_hashes
        flipped = bytearray(data[: head.length])
        flipped[-1] ^= 1
        with pytest.raises(CorruptShardError, match=r"shard y: header \(bytes 0-"):
            head.verify(flipped, "y")
        with pytest.raises(CorruptShardError, match="header"):
            head.verify(data[: head.length - 1], "y")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("header:xxh3_64:abc", "0" * 16, "length is not a number"),
        ("header:md9:100", "0" * 16, "unknown algorithm"),
        ("header:xxh3_64:100", "0" * 15, "16 lowercase hex digits"),
        ("header:xxh3_64:100", "Z" * 16, "16 lowercase hex digits"),
        ("header:xxh3_64:999999999", "0" * 16, "does not fit"),
    ],
)
def test_malformed_header_digests_are_format_errors(
    tmp_path: Path, samples: list[dict[str, Any]], key: str, value: str, match: str
) -> None:
    write_dataset(tmp_path, samples)
    index = json.loads((tmp_path / "index.json").read_text())
    hashes = index["shards"][0]["raw_data"]["hashes"]
    for old in [k for k in hashes if k.startswith("header:")]:
        del hashes[old]
    hashes[key] = value
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=rf"shard 0 \(shard.00000.mds\): raw_data: .*{match}"):
        load_index(tmp_path / "index.json")
