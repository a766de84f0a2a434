"""The piece table: one xxh3_64 digest per piece of the sample data, however it is split."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import xxhash

from shardstream.errors import ConfigError
from shardstream.hashing import hash_file
from shardstream.mds._pieces import check_piece_size, piece_table
from shardstream.mds._shard import shard_config, write_samples


def _reference(data: bytes, piece_size: int) -> bytes:
    return b"".join(
        xxhash.xxh3_64_digest(data[at : at + piece_size]) for at in range(0, len(data), piece_size)
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_table_does_not_depend_on_how_the_samples_are_split(seed: int) -> None:
    rng = random.Random(seed)
    parts = [
        rng.randbytes(rng.choice([0, 1, 7, 4095, 4096, 4097, 20_000]))
        for _ in range(rng.randint(1, 60))
    ]
    data = b"".join(parts)
    for piece_size in (4096, 8192, 65536):
        expected = _reference(data, piece_size)
        assert len(expected) == 8 * -(-len(data) // piece_size)
        assert piece_table(parts, piece_size) == expected
        assert piece_table([data], piece_size) == expected
        assert piece_table([memoryview(p) for p in parts], piece_size) == expected


def test_piece_sizes_are_checked() -> None:
    assert check_piece_size(None) is None and check_piece_size(65536) == 65536
    for bad in (0, 1024, 1 << 32, True, 4096.0):
        with pytest.raises(ConfigError, match="piece_size"):
            check_piece_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_a_shard_is_the_same_file_and_digests_however_its_samples_are_split(
    seed: int, tmp_path: Path
) -> None:
    # Big parts are hashed and written in steps, small ones whole: no byte may move.
    rng = random.Random(seed)
    sizes = [rng.choice([0, 5, 4096, 70_000, 300_000]) for _ in range(40)]
    samples = [rng.randbytes(size) for size in sizes]
    template = shard_config({"x": "bytes"}, compression=None, hashes=("sha1", "xxh3_64"),
                            size_limit=None)  # fmt: skip
    data = b"".join(samples)
    cut = sorted(rng.sample(range(len(data)), 5))
    splits = {
        "per sample": samples,
        "whole": [data],
        "few slices": [
            memoryview(data)[a:b] for a, b in zip([0, *cut], [*cut, len(data)], strict=True)
        ],
    }
    files, infos = set(), []
    for name, parts in splits.items():
        info = write_samples(tmp_path / name, "shard.00000.mds", template, sizes, parts)
        path = tmp_path / name / "shard.00000.mds"
        files.add(path.read_bytes())
        assert hash_file(["sha1", "xxh3_64"], path) == {
            a: info.raw_data.hashes[a] for a in ("sha1", "xxh3_64")
        }
        infos.append(info)
    assert len(files) == 1 and len({json.dumps(i.raw_data.hashes) for i in infos}) == 1


def test_a_table_held_in_the_index_is_the_same_table(tmp_path: Path) -> None:
    """``shardstream register`` keeps a table in the index (``piecetable:``): the digests
    of the same pieces as a header's table, parsed and checked as one; a wrong length, or
    two tables, is one FormatError naming the entry."""
    from shardstream.errors import CorruptShardError, FormatError
    from shardstream.mds import MDSWriter, PieceTable, load_index
    from shardstream.mds._blocks import BlockHasher
    from shardstream.mds._pieces import INDEX_TABLE_PIECES, index_piece_size, index_table_entry

    with MDSWriter(tmp_path, {"x": "bytes"}, block_size=8192, piece_size=4096) as writer:
        for i in range(300):
            writer.write({"x": bytes([i % 256]) * (50 + i)})
    shard = load_index(tmp_path / "index.json").shards[0]
    spec = shard.piece_spec
    assert spec is not None and spec.table is None
    data = (tmp_path / shard.raw_data.basename).read_bytes()
    hasher = BlockHasher("xxh3_64", 4096)
    hasher.update(data[spec.data_start :])
    key, value = index_table_entry(hasher.finish().hex, 4096)
    hashes = {k: v for k, v in shard.raw_data.hashes.items() if not k.startswith("pieces:")}
    listed = dataclasses.replace(
        shard, raw_data=dataclasses.replace(shard.raw_data, hashes={**hashes, key: value})
    )
    held = listed.piece_spec
    assert held is not None and held.table is not None
    assert (held.piece_size, held.data_start, held.pieces) == spec[:3]
    from_index = PieceTable(held, b"", shard.raw_data.bytes, "s")
    from_header = PieceTable(spec, data[: spec.data_start], shard.raw_data.bytes, "s")
    assert from_index._table == from_header._table
    lo, hi = from_index.span(1, 2)
    from_index.verify(1, data[lo:hi])
    with pytest.raises(CorruptShardError, match="piece 1"):
        from_index.verify(1, b"\0" + data[lo + 1 : hi])
    for bad in ({**hashes, key: value[:-16]}, {**shard.raw_data.hashes, key: value}):
        broken = dataclasses.replace(
            shard, raw_data=dataclasses.replace(shard.raw_data, hashes=bad)
        )
        with pytest.raises(FormatError, match="piece"):
            _ = broken.piece_spec
    assert index_piece_size(64 << 20) == 64 << 10  # 1,024 pieces
    assert index_piece_size(256 * 10**6) == 256 << 10
    assert -(-(256 * 10**6) // index_piece_size(256 * 10**6)) <= INDEX_TABLE_PIECES
