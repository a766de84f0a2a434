"""The piece table: one xxh3_64 digest per piece of the sample data, however it is split."""

from __future__ import annotations

import random

import pytest
import xxhash

from shardstream.errors import ConfigError
from shardstream.mds._pieces import check_piece_size, piece_table


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
