"""One shard-format value: every writer writes the same bytes from a ShardFormat as from
its settings given as keywords, and the settings are checked where the value is made."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardstream.errors import ConfigError
from shardstream.mds import (
    MDSWriter,
    ShardFormat,
    encode_sample,
    write_shard,
    write_shard_arrays,
)

COLUMNS = {"id": "int", "tokens": "ndarray:uint16:64"}


def _arrays(n: int) -> dict[str, np.ndarray]:
    return {
        "id": np.arange(n, dtype=np.int64),
        "tokens": (np.arange(n * 64) % 50_000).astype(np.uint16).reshape(n, 64),
    }


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_the_defaults_and_the_checks_live_in_the_value() -> None:
    fmt = ShardFormat()
    assert (fmt.compression, fmt.hashes, fmt.size_limit) == (None, ("sha1", "xxh3_64"), 128 << 20)
    assert (fmt.block_size, fmt.piece_size) == (4 << 20, 64 << 10)
    assert ShardFormat(hashes=("xxh3_64", "sha1", "sha1"), size_limit=0) == ShardFormat(
        hashes=("sha1", "xxh3_64"), size_limit=None
    )
    with pytest.raises(AttributeError):
        fmt.compression = "zstd"  # type: ignore[misc]  # frozen
    for bad, name in [
        ({"compression": "gzip"}, "compression"),
        ({"hashes": ("md5x",)}, "md5x"),
        ({"size_limit": 1 << 33}, "size_limit"),
        ({"block_size": 100}, "block_size"),
        ({"piece_size": 100}, "piece_size"),
    ]:
        with pytest.raises(ConfigError, match=name):
            ShardFormat(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fmt",
    [
        ShardFormat(),
        ShardFormat(compression="zstd", hashes=("xxh3_64",), size_limit=16 << 10),
        ShardFormat(block_size=None, piece_size=None),
        ShardFormat(block_size=8192, piece_size=4096, size_limit=None),
    ],
)
def test_every_writer_writes_the_same_bytes_from_the_value_as_from_keywords(
    fmt: ShardFormat, tmp_path: Path
) -> None:
    keywords = {
        "compression": fmt.compression,
        "hashes": fmt.hashes,
        "size_limit": fmt.size_limit,
        "block_size": fmt.block_size,
        "piece_size": fmt.piece_size,
    }
    arrays = _arrays(300)
    samples = [{"id": int(i), "tokens": arrays["tokens"][i]} for i in range(300)]
    encoded = [encode_sample(COLUMNS, s) for s in samples]
    for how, kwargs in [("value", {"fmt": fmt}), ("keywords", keywords)]:
        with MDSWriter(tmp_path / how / "writer", COLUMNS, **kwargs) as writer:  # type: ignore[arg-type]
            for sample in samples:
                writer.write(sample)
        assert writer.format == fmt
        one = write_shard(tmp_path / how / "one", "shard.00000.mds", COLUMNS, encoded, **kwargs)  # type: ignore[arg-type]
        arr = write_shard_arrays(
            tmp_path / how / "arr", "shard.00000.mds", COLUMNS, arrays, **kwargs
        )  # type: ignore[arg-type]
        assert one == arr
    for name in ("writer", "one", "arr"):
        assert _files(tmp_path / "value" / name) == _files(tmp_path / "keywords" / name)


def test_keywords_override_the_value(tmp_path: Path) -> None:
    base = ShardFormat(compression="zstd", block_size=8192)
    with MDSWriter(tmp_path / "w", COLUMNS, fmt=base, compression=None) as writer:
        writer.write({"id": 1, "tokens": np.zeros(64, np.uint16)})
    assert writer.format == ShardFormat(block_size=8192)
    info = write_shard_arrays(tmp_path, "s.mds", COLUMNS, _arrays(4), fmt=base, hashes=["sha1"])
    assert info.compression == "zstd" and info.hashes == ("sha1",)
    with pytest.raises(TypeError):
        write_shard_arrays(tmp_path, "t.mds", COLUMNS, _arrays(4), shard_size=1)  # type: ignore[call-arg]
