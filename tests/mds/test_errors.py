"""Bad shards, bad indexes and bad samples fail with one clear shardstream error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.errors import (
    ConfigError,
    CorruptShardError,
    FormatError,
    HashMismatchError,
    InputError,
    UnsupportedEncodingError,
)
from shardstream.mds import (
    MDSWriter,
    ShardReader,
    decompress_shard,
    load_index,
    write_shard_arrays,
)
from tests.mds.conftest import ALL_COLUMNS, FIXED_COLUMNS, make_fixed


@pytest.fixture
def dataset(tmp_path: Path, samples: list[dict[str, Any]]) -> Path:
    """A two-shard dataset over ALL_COLUMNS (mixed fixed- and variable-size columns)."""
    root = tmp_path / "ds"
    with MDSWriter(root, ALL_COLUMNS, size_limit=80_000) as writer:
        for sample in samples:
            writer.write(sample)
    return root


def rewrite(path: Path, edit: Any) -> None:
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(edit(data)))


def test_truncated_shard(dataset: Path) -> None:
    shard = dataset / "shard.00000.mds"
    rewrite(shard, lambda d: d[:-10])
    with pytest.raises(CorruptShardError, match=r"shard\.00000\.mds.*do not fit the file size"):
        ShardReader(shard)
    rewrite(shard, lambda d: d[:6])
    with pytest.raises(CorruptShardError, match="too short"):
        ShardReader(shard)


def test_absurd_sample_count(dataset: Path) -> None:
    shard = dataset / "shard.00000.mds"
    rewrite(shard, lambda d: np.uint32(2**31).tobytes() + d[4:])
    with pytest.raises(CorruptShardError, match=r"2147483648 samples, which cannot fit"):
        ShardReader(shard)


def test_garbled_offsets(dataset: Path) -> None:
    shard = dataset / "shard.00000.mds"
    rewrite(shard, lambda d: d[:8] + np.uint32(3).tobytes() + d[12:])
    with pytest.raises(CorruptShardError, match="offsets"):
        ShardReader(shard)


def test_garbled_sample_sizes(dataset: Path) -> None:
    shard = dataset / "shard.00000.mds"
    first = int(np.frombuffer(shard.read_bytes(), "<u4", 1, 4)[0])
    rewrite(shard, lambda d: d[:first] + np.uint32(10**6).tobytes() + d[first + 4 :])
    reader = ShardReader(shard)
    with pytest.raises(CorruptShardError, match=r"shard\.00000\.mds: sample 0 column"):
        reader[0]
    with pytest.raises(CorruptShardError, match="runs past the end"):
        reader.gather("u8", np.array([1, 0]))
    assert reader[1]["num"] == -(2**62 + 1)  # the other samples stay readable


def test_index_disagrees_with_shard(dataset: Path) -> None:
    info = load_index(dataset / "index.json").shards[1]
    bad = type(info)(**{**info.__dict__, "samples": info.samples + 1})
    with pytest.raises(CorruptShardError, match=r"shard\.00001\.mds: file has \d+ samples"):
        ShardReader(dataset / "shard.00001.mds", bad)


def test_hash_mismatch(dataset: Path) -> None:
    index = load_index(dataset / "index.json")
    shard = dataset / "shard.00001.mds"
    rewrite(shard, lambda d: d[:-1] + bytes([d[-1] ^ 1]))
    ShardReader(shard, index.shards[1])  # the layout is intact: no check without verify
    with pytest.raises(HashMismatchError, match=r"shard\.00001\.mds: xxh3_64 is"):
        ShardReader(shard, index.shards[1], verify=True)


def test_corrupt_and_truncated_zstd(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", FIXED_COLUMNS, compression="zstd") as writer:
        for i in range(20):
            writer.write({k: (v[i] if k != "id" else i) for k, v in make_fixed(20).items()})
    info = writer.index.shards[0]
    assert info.zip_data is not None and info.zip_data.basename == "shard.00000.mds.zstd"
    src = tmp_path / "ds" / info.zip_data.basename
    decompress_shard(src, tmp_path / "ok.mds", "zstd", expected_size=info.raw_data.bytes)
    assert len(ShardReader(tmp_path / "ok.mds", info, verify=True)) == 20
    rewrite(src, lambda d: d[: len(d) // 2])
    with pytest.raises(CorruptShardError, match=r"shard\.00000\.mds\.zstd.*does not decompress"):
        decompress_shard(src, tmp_path / "out.mds", "zstd")
    src.write_bytes(b"not zstd at all")
    with pytest.raises(CorruptShardError, match="does not decompress"):
        decompress_shard(src, tmp_path / "out.mds", "zstd")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "ok.mds"]  # no partial output


def write_index(root: Path, edit: Any) -> Path:
    obj = json.loads((root / "index.json").read_text())
    edit(obj)
    path = root / "edited.json"
    path.write_text(json.dumps(obj))
    return path


def test_unknown_encoding_in_index(dataset: Path) -> None:
    def edit(obj: dict[str, Any]) -> None:
        shard = obj["shards"][1]
        shard["column_encodings"][shard["column_names"].index("text")] = "pkl"

    with pytest.raises(
        UnsupportedEncodingError,
        match=r"edited\.json: shard 1 \(shard\.00001\.mds\): column 'text'.*pkl",
    ):
        load_index(write_index(dataset, edit))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.update(version=1), r"edited\.json: field 'version' is 1"),
        (lambda o: o["shards"][0].update(version=3), r"shard 0 .*field 'version' is 3"),
        (lambda o: o["shards"][0].update(format="json"), r"field 'format' is 'json'"),
        (lambda o: o["shards"][0].pop("samples"), r"missing field 'samples'"),
        (lambda o: o["shards"][0].update(column_sizes=[1]), "same length"),
        (lambda o: o["shards"][0]["raw_data"].update(basename="../x"), "not a relative file"),
        (lambda o: o["shards"][0].update(compression="lz4"), r"field 'compression'"),
        (lambda o: o.update(shards={}), r"field 'shards' must be a list"),
    ],
)
def test_malformed_index(dataset: Path, edit: Any, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        load_index(write_index(dataset, edit))


def test_index_not_json(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text("{nope")
    with pytest.raises(FormatError, match=r"index\.json: not valid JSON"):
        load_index(tmp_path / "index.json")
    with pytest.raises(FormatError, match="cannot read"):
        load_index(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"tokens": np.zeros(4, np.uint16)}, r"sample has no column 'id'"),
        ({"tokens": np.zeros(4, np.int32), "id": 1, "text": ""}, r"column 'tokens'.*wrong dtype"),
        ({"tokens": np.zeros(5, np.uint16), "id": 1, "text": ""}, r"column 'tokens'.*wrong shape"),
        ({"tokens": [1, 2, 3, 4], "id": 1, "text": ""}, r"column 'tokens'.*numpy\.ndarray"),
        ({"tokens": np.zeros(4, np.uint16), "id": "1", "text": ""}, r"column 'id'.*expected int"),
        ({"tokens": np.zeros(4, np.uint16), "id": 2**64, "text": ""}, r"column 'id'.*int64"),
        ({"tokens": np.zeros(4, np.uint16), "id": 1, "text": 3}, r"column 'text'.*expected str"),
        ({"tokens": b"abc", "id": 1, "text": ""}, r"column 'tokens'.*encoded size is 3"),
    ],
)
def test_bad_samples_name_the_column(tmp_path: Path, sample: dict[str, Any], message: str) -> None:
    columns = {"tokens": "ndarray:uint16:4", "id": "int", "text": "str"}
    with pytest.raises(InputError, match=message), MDSWriter(tmp_path / "ds", columns) as writer:
        writer.write({"tokens": np.ones(4, np.uint16), "id": 0, "text": "ok"})
        writer.flush_shard()
        writer.write(sample)
    # The completed shard stays, but nothing looks like a finished dataset.
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["shard.00000.mds"]


def test_scalar_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"column 'b' \(uint8\): 300"):
        MDSWriter(tmp_path, {"b": "uint8"}).write({"b": 300})


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"columns": {"a": "pkl"}}, UnsupportedEncodingError, "pickle is refused"),
        ({"columns": {"a": "ndarray:uint7"}}, UnsupportedEncodingError, "bad ndarray encoding"),
        ({"columns": {"a": "ndarray:uint8:0"}}, UnsupportedEncodingError, "positive integers"),
        ({"columns": {}}, ConfigError, "at least one column"),
        ({"compression": "gz"}, ConfigError, "unsupported compression 'gz'"),
        ({"compression": "zstd:99"}, ConfigError, "unsupported compression"),
        ({"hashes": ("sha1", "crc")}, ConfigError, "unknown hash algorithm 'crc'"),
        ({"size_limit": 1 << 32}, ConfigError, "size_limit"),
    ],
)
def test_bad_writer_settings(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    args: dict[str, Any] = {"columns": {"a": "int"}, **kwargs}
    with pytest.raises(error, match=message):
        MDSWriter(tmp_path / "ds", **args)


def test_existing_dataset_is_not_overwritten(dataset: Path) -> None:
    with pytest.raises(ConfigError, match="already holds a dataset"):
        MDSWriter(dataset, {"a": "int"})
    with MDSWriter(dataset, {"a": "int"}, exist_ok=True) as writer:
        writer.write({"a": 1})
    assert load_index(dataset / "index.json").num_samples == 1


def test_vectorized_writer_checks_arrays(tmp_path: Path) -> None:
    arrays = make_fixed(10)
    bad = {**arrays, "tokens": arrays["tokens"].astype(np.int32)}
    with pytest.raises(
        InputError, match=r"column 'tokens' \(ndarray:uint16:32\) needs dtype uint16"
    ):
        write_shard_arrays(tmp_path, "shard.00000.mds", FIXED_COLUMNS, bad)
    short = {**arrays, "id": arrays["id"][:5]}
    with pytest.raises(InputError, match="one common length"):
        write_shard_arrays(tmp_path, "shard.00000.mds", FIXED_COLUMNS, short)
    with pytest.raises(ConfigError, match="variable-size"):
        write_shard_arrays(tmp_path, "shard.00000.mds", {"t": "str"}, {"t": np.zeros(3)})
    assert list(tmp_path.iterdir()) == []


def test_sample_must_be_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="must map column names to values, got list"):
        MDSWriter(tmp_path, {"a": "int"}).write([1])  # type: ignore[arg-type]


def test_shard_from_another_index_is_refused(tmp_path: Path, dataset: Path) -> None:
    info = load_index(dataset / "index.json").shards[0]
    arrays = make_fixed(info.samples)
    write_shard_arrays(tmp_path, "other.mds", FIXED_COLUMNS, arrays)
    size = (tmp_path / "other.mds").stat().st_size
    lying = type(info)(**{**info.__dict__, "raw_data": type(info.raw_data)("other.mds", size)})
    with pytest.raises(CorruptShardError, match=r"other\.mds: its header lists columns"):
        ShardReader(tmp_path / "other.mds", lying)
    with pytest.raises(ConfigError, match="verify=True needs"):
        ShardReader(tmp_path / "other.mds", verify=True)
