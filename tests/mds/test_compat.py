"""Compatibility with the real mosaicml-streaming 0.13, in both directions and byte for byte."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import streaming
from PIL import Image

from shardstream.mds import (
    MDSIndex,
    MDSWriter,
    ShardReader,
    decompress_shard,
    load_index,
    samples_per_shard,
    write_shard_arrays,
)
from tests.mds.conftest import (
    ALL_COLUMNS,
    FIXED_COLUMNS,
    assert_sample_equal,
    fixed_samples,
    make_fixed,
    shard_files,
)

SETTINGS = [
    pytest.param(None, ("sha1",), id="raw-sha1"),
    pytest.param(None, ("xxh3_64",), id="raw-xxh3"),
    pytest.param("zstd", ("sha1",), id="zstd-sha1"),
    pytest.param("zstd:7", ("sha1", "xxh3_64"), id="zstd7-both"),
]


def read_with_streaming(
    root: Path, cache: Path, validate_hash: str | None = None
) -> list[dict[str, Any]]:
    """Every sample through streaming.StreamingDataset, in order, from a local 'remote'."""
    dataset = streaming.StreamingDataset(
        remote=str(root),
        local=str(cache),
        shuffle=False,
        batch_size=1,
        validate_hash=validate_hash,
    )
    return [dataset[i] for i in range(len(dataset))]


def read_with_ours(root: Path, scratch: Path) -> list[dict[str, Any]]:
    """Every sample through load_index + ShardReader (decompressing first when needed)."""
    index = load_index(root / "index.json")
    out = []
    for shard in index.shards:
        path = root / shard.raw_data.basename
        if shard.zip_data is not None:
            path = scratch / shard.raw_data.basename
            decompress_shard(root / shard.zip_data.basename, path, shard.compression or "")
        reader = ShardReader(path, shard, verify=True)
        assert len(reader) == shard.samples
        out.extend(reader[i] for i in range(len(reader)))
    return out


@pytest.mark.parametrize(("compression", "hashes"), SETTINGS)
def test_our_shards_read_by_streaming(
    tmp_path: Path, samples: list[dict[str, Any]], compression: str | None, hashes: tuple[str, ...]
) -> None:
    with MDSWriter(
        tmp_path / "ds", ALL_COLUMNS, compression=compression, hashes=hashes, size_limit=40_000
    ) as writer:
        for sample in samples:
            writer.write(sample)
    assert len(writer.index.shards) > 1
    got = read_with_streaming(tmp_path / "ds", tmp_path / "cache", validate_hash=hashes[0])
    assert len(got) == len(samples)
    for mine, theirs in zip(samples, got, strict=True):
        assert_sample_equal(theirs, mine)


@pytest.mark.parametrize(("compression", "hashes"), SETTINGS)
def test_streaming_shards_read_by_us(
    tmp_path: Path, samples: list[dict[str, Any]], compression: str | None, hashes: tuple[str, ...]
) -> None:
    with streaming.MDSWriter(
        columns=ALL_COLUMNS,
        out=str(tmp_path / "ds"),
        compression=compression,
        hashes=list(hashes),
        size_limit=40_000,
    ) as writer:
        for sample in samples:
            writer.write(sample)
    (tmp_path / "scratch").mkdir()
    got = read_with_ours(tmp_path / "ds", tmp_path / "scratch")
    assert len(got) == len(samples)
    for mine, ours in zip(samples, got, strict=True):
        assert_sample_equal(ours, mine)


@pytest.mark.parametrize(("compression", "hashes"), SETTINGS)
def test_byte_identical_to_streaming(
    tmp_path: Path, samples: list[dict[str, Any]], compression: str | None, hashes: tuple[str, ...]
) -> None:
    kwargs: dict[str, Any] = {"compression": compression, "size_limit": 40_000}
    for folder, block_size in [("ours", None), ("blocks", 4096)]:
        with MDSWriter(
            tmp_path / folder, ALL_COLUMNS, hashes=hashes, block_size=block_size, **kwargs
        ) as ours:
            for sample in samples:
                ours.write(sample)
    with streaming.MDSWriter(
        columns=ALL_COLUMNS, out=str(tmp_path / "theirs"), hashes=list(hashes), **kwargs
    ) as theirs:
        for sample in samples:
            theirs.write(sample)
    mine, reference = shard_files(tmp_path / "ours"), shard_files(tmp_path / "theirs")
    assert sorted(mine) == sorted(reference)
    assert len(mine) > 2  # several shards plus the index
    for name in reference:
        assert mine[name] == reference[name], name
    # Block and header digests change no shard byte, and the index only by their
    # raw_data.hashes entries.
    with_blocks = shard_files(tmp_path / "blocks")
    assert {n: b for n, b in with_blocks.items() if n != "index.json"} == {
        n: b for n, b in reference.items() if n != "index.json"
    }
    index = json.loads(with_blocks["index.json"])
    for shard in index["shards"]:
        found = [k for k in shard["raw_data"]["hashes"] if k.startswith(("blocks:", "header:"))]
        assert len(found) == 2 * (compression is None)
        for key in found:
            del shard["raw_data"]["hashes"][key]
    assert json.dumps(index, sort_keys=True).encode() == reference["index.json"]


def test_pil_images_encoded_like_streaming(tmp_path: Path) -> None:
    """PIL input: JPEG from a file keeps the file's bytes, others are encoded as MosaicML does."""
    rng = np.random.default_rng(3)
    jpeg_path = tmp_path / "photo.jpg"
    Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)).save(jpeg_path, quality=91)
    images = [
        Image.fromarray(rng.integers(0, 256, (8, 5, 3), dtype=np.uint8)),
        Image.fromarray(rng.integers(0, 256, (4, 4), dtype=np.uint8), mode="L"),
    ]
    columns = {"jpg": "jpeg", "pic": "png"}
    samples: list[dict[str, Any]] = [{"jpg": img, "pic": img} for img in images]
    samples.append({"jpg": Image.open(jpeg_path), "pic": images[0]})
    with MDSWriter(
        tmp_path / "ours", columns, hashes=("sha1",), size_limit=1 << 26, block_size=None
    ) as ours:
        for sample in samples:
            ours.write(sample)
    with streaming.MDSWriter(columns=columns, out=str(tmp_path / "theirs"), hashes=["sha1"]) as w:
        for sample in samples:
            w.write(sample)
    assert shard_files(tmp_path / "ours") == shard_files(tmp_path / "theirs")
    reader = ShardReader(tmp_path / "ours" / "shard.00000.mds")
    assert reader[2]["jpg"] == jpeg_path.read_bytes()
    png = Image.open(BytesIO(reader[1]["pic"]))
    assert png.format == "PNG" and np.array_equal(np.asarray(png), np.asarray(images[1]))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_vectorized_writer_matches_streaming(tmp_path: Path, compression: str | None) -> None:
    """write_shard_arrays + samples_per_shard == streaming.MDSWriter, file for file."""
    arrays = make_fixed(300)
    limit = 6_000
    per_shard = samples_per_shard(FIXED_COLUMNS, limit, compression=compression)
    (tmp_path / "ours").mkdir()
    shards = []
    for k, start in enumerate(range(0, 300, per_shard)):
        chunk = {name: a[start : start + per_shard] for name, a in arrays.items()}
        shards.append(
            write_shard_arrays(
                tmp_path / "ours",
                f"shard.{k:05}.mds",
                FIXED_COLUMNS,
                chunk,
                compression=compression,
                size_limit=limit,
                block_size=None,
            )
        )
    MDSIndex(shards).write(tmp_path / "ours" / "index.json")
    with streaming.MDSWriter(
        columns=FIXED_COLUMNS,
        out=str(tmp_path / "theirs"),
        compression=compression,
        hashes=["sha1", "xxh3_64"],
        size_limit=limit,
    ) as writer:
        for sample in fixed_samples(arrays):
            writer.write(sample)
    assert len(shards) > 3
    assert shard_files(tmp_path / "ours") == shard_files(tmp_path / "theirs")
    got = read_with_streaming(tmp_path / "ours", tmp_path / "cache", validate_hash="xxh3_64")
    assert np.array_equal(np.stack([s["tokens"] for s in got]), arrays["tokens"])
