"""ShardReader: O(1) access, zero-copy views, vectorized gathers; writer paths agree."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from streaming.base.format.mds.encodings import mds_decode, mds_encode

from shardstream import mds
from shardstream.errors import ConfigError
from shardstream.mds import (
    ENCODINGS,
    MDSWriter,
    ShardReader,
    encode_sample,
    get_codec,
    load_index,
    samples_per_shard,
    write_shard,
    write_shard_arrays,
)
from tests.mds.conftest import (
    ALL_COLUMNS,
    DYN_DTYPES,
    FIXED_COLUMNS,
    assert_sample_equal,
    fixed_samples,
    make_fixed,
)


@pytest.fixture
def fixed_shard(tmp_path: Path) -> tuple[ShardReader, dict[str, np.ndarray]]:
    arrays = make_fixed(200)
    write_shard_arrays(tmp_path, "shard.00000.mds", FIXED_COLUMNS, arrays)
    return ShardReader(tmp_path / "shard.00000.mds"), arrays


def test_fixed_shard_samples_are_views(
    fixed_shard: tuple[ShardReader, dict[str, np.ndarray]],
) -> None:
    reader, arrays = fixed_shard
    assert len(reader) == 200
    whole = reader.column("tokens")
    for i in (0, 1, 137, 199, -1):
        sample = reader[i]
        assert np.array_equal(sample["tokens"], arrays["tokens"][i])
        assert np.shares_memory(sample["tokens"], whole)  # a view into the mapping
        assert not sample["tokens"].flags.writeable
        assert sample["id"] == arrays["id"][i] and type(sample["id"]) is int
        assert sample["label"] == arrays["label"][i]
    with pytest.raises(IndexError):
        reader[200]


def test_gather_is_one_array_equal_to_per_sample_reads(
    fixed_shard: tuple[ShardReader, dict[str, np.ndarray]],
) -> None:
    reader, arrays = fixed_shard
    idx = np.random.default_rng(0).permutation(200)[:64]
    for column in FIXED_COLUMNS:
        got = reader.gather(column, idx)
        assert got.shape == arrays[column][idx].shape
        assert np.array_equal(got, arrays[column][idx])
        per_sample = np.stack([np.asarray(reader[int(i)][column]) for i in idx])
        assert np.array_equal(got, per_sample)
    run = reader.gather("tokens", np.arange(20, 52))
    assert np.shares_memory(run, reader.column("tokens")), "a contiguous run must be zero-copy"
    assert np.array_equal(run, arrays["tokens"][20:52])
    with pytest.raises(IndexError):
        reader.gather("tokens", np.array([0, 200]))
    with pytest.raises(ConfigError, match="no column 'nope'"):
        reader.gather("nope", idx)


def test_gather_in_mixed_shards_uses_offsets(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    """Fixed-size columns behind variable-size ones are found through the offsets array."""
    with MDSWriter(tmp_path, ALL_COLUMNS, size_limit=None) as writer:
        for sample in samples:
            writer.write(sample)
    reader = ShardReader(tmp_path / "shard.00000.mds")
    idx = np.array([29, 0, 3, 3, 17])
    for column in ("arr_fixed", "u8", "u64", "i32", "f16", "f64", "num"):
        got = reader.gather(column, idx)
        want = np.stack([np.asarray(samples[i][column]) for i in idx])
        assert np.array_equal(got.astype(want.dtype), want), column
    with pytest.raises(ConfigError, match="variable-size"):
        reader.gather("text", idx)
    assert np.array_equal(reader.column("u16"), [s["u16"] for s in samples])
    for i in (0, 5, 29):  # sample 5 has a 70000-wide dynamic array
        assert_sample_equal(reader[i], samples[i])
    assert np.shares_memory(reader[1]["arr_fixed"], np.frombuffer(reader._mmap, np.uint8))


def test_write_shard_equals_vectorized_and_writer(tmp_path: Path) -> None:
    arrays = make_fixed(50)
    encoded = [encode_sample(FIXED_COLUMNS, s) for s in fixed_samples(arrays)]
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    a = write_shard(tmp_path / "a", "shard.00000.mds", FIXED_COLUMNS, encoded, compression="zstd")
    b = write_shard_arrays(
        tmp_path / "b", "shard.00000.mds", FIXED_COLUMNS, arrays, compression="zstd"
    )
    with MDSWriter(tmp_path / "c", FIXED_COLUMNS, compression="zstd") as writer:
        for sample in fixed_samples(arrays):
            writer.write(sample)
    assert a == b == writer.index.shards[0]
    data = {(tmp_path / n / "shard.00000.mds.zstd").read_bytes() for n in ("a", "b", "c")}
    assert len(data) == 1
    assert not list(tmp_path.glob("*/.*.tmp"))


def test_samples_per_shard_follows_size_limit(tmp_path: Path) -> None:
    limit = 9_000
    per_shard = samples_per_shard(FIXED_COLUMNS, limit)
    arrays = make_fixed(per_shard * 3 + 1)
    with MDSWriter(tmp_path, FIXED_COLUMNS, size_limit=limit) as writer:
        for sample in fixed_samples(arrays):
            writer.write(sample)
    sizes = [s.samples for s in writer.index.shards]
    assert sizes == [per_shard, per_shard, per_shard, 1]
    assert all(s.raw_data.bytes <= limit for s in writer.index.shards)
    assert writer.index.shards[0].raw_data.bytes + (64 + 8 + 8 + 4 + 2) + 4 > limit
    assert samples_per_shard(FIXED_COLUMNS, 100) == 1
    with pytest.raises(ConfigError, match="variable-size"):
        samples_per_shard({"t": "str"}, limit)


def test_reader_without_index_uses_header_config(tmp_path: Path) -> None:
    arrays = make_fixed(10)
    info = write_shard_arrays(tmp_path, "shard.00000.mds", FIXED_COLUMNS, arrays, size_limit=None)
    reader = ShardReader(tmp_path / "shard.00000.mds")
    assert reader.info.columns == info.columns and reader.columns == dict(
        sorted(FIXED_COLUMNS.items())
    )
    text = json.dumps({"version": 2, "shards": [info.to_dict()]})
    assert load_index(text.encode()).shards == [info]
    assert load_index(text).shards == [info]  # JSON text works as well as bytes or a path


def test_encodings_list_is_complete() -> None:
    for encoding in ENCODINGS:
        assert get_codec(encoding).encoding == encoding
    assert get_codec("ndarray:int64:2,3").size == 48 and get_codec("ndarray:int64").size is None


dyn_arrays = st.sampled_from(DYN_DTYPES).flatmap(
    lambda dtype: hnp.arrays(
        dtype,
        hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=300).filter(
            lambda s: int(np.prod(s)) <= 5000
        ),
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arr=dyn_arrays)
def test_dynamic_ndarray_matches_streaming(arr: np.ndarray) -> None:
    for encoding in (
        "ndarray",
        f"ndarray:{arr.dtype.name}",
        f"ndarray:{arr.dtype.name}:" + ",".join(map(str, arr.shape)),
    ):
        codec = get_codec(encoding)
        data = codec.encode(arr)
        assert data == mds_encode(encoding, arr)
        ours = codec.decode(data)
        assert ours.dtype == arr.dtype and ours.shape == arr.shape
        assert np.array_equal(ours, arr, equal_nan=arr.dtype.kind == "f")
        assert np.array_equal(mds_decode(encoding, data), ours, equal_nan=arr.dtype.kind == "f")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    side=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
    idx_seed=st.integers(0, 1000),
)
def test_random_fixed_shards_roundtrip(
    tmp_path_factory: pytest.TempPathFactory, n: int, side: int, seed: int, idx_seed: int
) -> None:
    columns = {"x": f"ndarray:float64:{side},2", "y": "int8", "t": "str"}
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, side, 2))
    ys = rng.integers(-128, 128, n).astype(np.int8)
    root = tmp_path_factory.mktemp("rt")
    encoded = [encode_sample(columns, {"x": xs[i], "y": ys[i], "t": "a" * i}) for i in range(n)]
    write_shard(root, "shard.00000.mds", columns, encoded)
    reader = ShardReader(root / "shard.00000.mds")
    idx = np.random.default_rng(idx_seed).integers(0, n, 17)
    assert np.array_equal(reader.gather("x", idx), xs[idx])
    assert np.array_equal(reader.gather("y", idx), ys[idx])
    assert reader[n - 1]["t"] == "a" * (n - 1)


def test_reader_pickles_by_reopening(
    fixed_shard: tuple[ShardReader, dict[str, np.ndarray]],
) -> None:
    """DataLoader workers receive readers by pickle: the copy maps the same file."""
    reader, arrays = fixed_shard
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.path == reader.path and copy.info == reader.info
    assert np.array_equal(copy.gather("tokens", np.array([3, 1])), arrays["tokens"][[3, 1]])


def test_public_api_is_stable() -> None:
    """The names other parts import; change this list only on purpose."""
    assert len(set(mds.__all__)) == len(mds.__all__)
    assert all(hasattr(mds, name) for name in mds.__all__)
    contract = {
        "MDSWriter",
        "MDSIndex",
        "ShardInfo",
        "ShardReader",
        "load_index",
        "encode_sample",
        "write_shard",
        "decompress_shard",
        "ENCODINGS",
    }
    assert contract <= set(mds.__all__)
    assert {"write_shard_arrays", "samples_per_shard", "FileInfo"} <= set(mds.__all__)
