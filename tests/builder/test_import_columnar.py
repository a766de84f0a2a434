"""The bulk (columnar) encoding of import batches gives exactly the per-record encoder's bytes.

Two levels: :func:`encode_batch` against ``make_parts_encoder`` over random schemas and
values (hypothesis), and whole imports of every format whose shards and ``index.json``
must not change when the bulk path, or the formats' own batch readers, are switched off.
"""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from litdata import TokensLoader, optimize

from shardstream.errors import InputError
from shardstream.mds import Codec, get_codec, make_parts_encoder
from shardstream.shard_builder.importers import ImportConfig, build_import, unit
from shardstream.shard_builder.importers import hf as hf_format
from shardstream.shard_builder.importers import litdata as litdata_format
from shardstream.shard_builder.importers import lmdb as lmdb_format
from shardstream.shard_builder.importers import tfrecord as tfrecord_format
from shardstream.shard_builder.importers.columnar import batches_of, columnize, encode_batch
from shardstream.shard_builder.importers.source import Batch, Record
from tests.builder.conftest import dir_bytes
from tests.fixtures.foreign_shards import webdataset_samples, write_tfrecord, write_webdataset

SMALL = {"shard_size": 6 * 1024, "allow_small_shards": True, "progress": False}

_INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
_DTYPES: list[np.dtype[Any]] = [np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.uint8)]
_ARRAYS: st.SearchStrategy[np.ndarray[Any, Any]] = hnp.arrays(
    st.sampled_from(_DTYPES),
    hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
)
# Per encoding: values the formats give (plain), and odd ones (other types, out of range).
VALUES: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "bytes": (st.binary(max_size=40), st.one_of(st.text(max_size=3), st.integers())),
    "str": (st.text(max_size=12), st.one_of(st.just("\ud800"), st.binary(max_size=4))),
    "int": (_INT64, st.one_of(st.integers(1 << 63, 1 << 65), st.booleans(), st.floats())),
    "float64": (st.floats(), st.one_of(_INT64, st.booleans())),
    "json": (
        st.one_of(st.none(), st.lists(st.integers(), max_size=3), st.text(max_size=5)),
        st.just({1, 2}),
    ),
    "ndarray": (_ARRAYS, st.one_of(st.integers(), hnp.arrays(np.int64, ()))),
    "ndarray:int32": (hnp.arrays(np.int32, st.integers(1, 4)), hnp.arrays(np.int16, 2)),
    "ndarray:int32:3": (hnp.arrays(np.int32, 3), hnp.arrays(np.int32, st.integers(1, 4))),
}


@st.composite
def _batches(draw: st.DrawFn) -> tuple[dict[str, str], Batch]:
    encodings = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=4))
    names = draw(st.permutations([f"c{i}" for i in range(len(encodings))]))
    n = draw(st.integers(1, 6))
    columns: dict[str, tuple[str, list[Any]]] = {}
    for name, enc in zip(names, encodings, strict=True):
        plain, odd = VALUES[enc]
        odd_rate = draw(st.sampled_from([0.0, 0.0, 0.3]))
        values = [draw(odd if draw(st.floats(0, 1)) < odd_rate else plain) for _ in range(n)]
        columns[name] = (enc, values)
    schema = {name: enc for name, (enc, _) in columns.items()}
    return schema, Batch(n, str, columns)


def _codecs(schema: dict[str, str]) -> tuple[tuple[str, Codec], ...]:
    return tuple((name, get_codec(enc)) for name, enc in sorted(schema.items()))


def _one_by_one(schema: dict[str, str], batch: Batch) -> bytes | None:
    encode = make_parts_encoder(schema)
    out = []
    for _, sample in batch.records():
        try:
            parts, size = encode({name: value for name, (_, value) in sample.items()})
        except InputError:
            return None
        assert sum(map(len, parts)) == size
        out.append(b"".join(parts))
    return b"".join(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches())
def test_bulk_bytes_are_the_per_record_bytes(case: tuple[dict[str, str], Batch]) -> None:
    schema, batch = case
    want = _one_by_one(schema, batch)
    got = encode_batch(_codecs(schema), batch)
    # Bytes as views of a format's buffer (LMDB pages, TFRecord files): the same outcome.
    assert batch.columns is not None
    views = {
        name: (enc, [memoryview(v) if type(v) is bytes else v for v in values])
        for name, (enc, values) in batch.columns.items()
    }
    got_views = encode_batch(_codecs(schema), Batch(batch.count, str, views))
    assert _one_by_one(schema, Batch(batch.count, str, views)) == want
    assert (got_views is None) == (got is None)
    if got is not None and got_views is not None:
        assert b"".join(got_views[0]) == b"".join(got[0])
        assert got_views[1].tolist() == got[1].tolist()
    if got is None:
        return  # declined: the caller encodes record by record (and names the bad ones)
    # Never accepts what the per-record encoder refuses, and then gives its bytes exactly.
    assert want is not None
    pieces, sizes = got
    assert b"".join(pieces) == want
    assert sizes.sum() == len(want) and len(sizes) == batch.count


def test_plain_values_take_the_bulk_path() -> None:
    columns: dict[str, tuple[str, Any]] = {
        "blob": ("bytes", [b"ab", b"", b"xyz"]),
        "label": ("int", [1, -2, 3]),
        "score": ("float64", [0.5, 1.5, -2.0]),
        "text": ("str", ["a", "bé", ""]),
        "vec": ("ndarray", [np.arange(2, dtype=np.int32)] * 3),
        "fixed": ("ndarray:uint16:4", np.arange(12, dtype=np.uint16).reshape(3, 4)),
    }
    batch = Batch(3, str, columns)
    schema = {name: enc for name, (enc, _) in columns.items()}
    got = encode_batch(_codecs(schema), batch)
    assert got is not None and b"".join(got[0]) == _one_by_one(schema, batch)


def test_records_of_several_layouts_stay_rows_and_slice_like_columns() -> None:
    records: list[Record] = [(f"r{i}", {"a": ("int", i), "b": ("str", str(i))}) for i in range(5)]
    batch = columnize(records)
    assert batch.columns is not None
    assert list(batch.tail(2).records()) == records[2:]
    mixed: list[Record] = [*records, ("r5", {"a": ("json", None), "b": ("str", "5")})]
    assert columnize(mixed).columns is None
    assert list(columnize(mixed).tail(4).records()) == mixed[4:]
    assert [b.count for b in batches_of(iter(records), 2)] == [2, 2, 1]


def test_litdata_items_are_columns_only_where_read_would_give_one_encoding() -> None:
    columns = litdata_format._item_columns
    assert columns([{"a": 1, "b": b"x"}, {"a": 2, "b": b""}]) == {
        "a": ("int", [1, 2]),
        "b": ("bytes", [b"x", b""]),
    }
    assert columns([b"x", b"y"]) == {"value": ("bytes", [b"x", b"y"])}
    assert columns([{"a": 1}, {"a": None}]) is None  # int and json
    assert columns([{"a": 1}, {"a": np.int64(2)}]) is None  # converted by column_of
    assert columns([{"a": 1}, {"b": 1}]) is None
    assert columns([{1: 1, "1": 2}]) is None  # one column name twice
    assert columns([{"a": 1}, 3]) is None


# Whole imports: the same bytes with the bulk path on, off, and without the batch readers.


def _lmdb_raw(root: Path) -> dict[str, Any]:
    env = lmdb.open(str(root / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(2_500):
            txn.put(f"k{i:05d}".encode(), bytes([i % 256]) * (i % 300))
    env.close()
    return {"format": "lmdb", "inputs": (str(root / "db"),), "part_bytes": 100_000}


def _lmdb_pickle(root: Path) -> dict[str, Any]:
    # Values of several types (a rows batch) and of one type (a column batch).
    env = lmdb.open(str(root / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(2_200):
            value: Any = {"i": i} if 1000 <= i < 1010 else [i, "x"] if i < 1500 else i * 3
            txn.put(f"k{i:05d}".encode(), pickle.dumps(value))
    env.close()
    return {
        "format": "lmdb", "inputs": (str(root / "db"),), "value_format": "pickle",
        "allow_pickle": True, "skip_bad": True,
    }  # fmt: skip


def _lit_item(i: int) -> dict[str, Any]:
    # (LitData fixes each key's type from the first item: no mixed types in one folder.)
    return {
        "id": i, "name": f"item-{i}", "score": i / 3, "blob": bytes([i % 256]) * (i % 40),
        "vec": np.arange(i % 3 + 1, dtype=np.int32),
    }  # fmt: skip


def _litdata(root: Path) -> dict[str, Any]:
    optimize(fn=_lit_item, inputs=list(range(2_100)), output_dir=str(root / "lit"),
             chunk_bytes="64KB", num_workers=1, verbose=False)  # fmt: skip
    return {"format": "litdata", "inputs": (str(root / "lit"),), "part_bytes": 20_000}


def _tokens(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(300 + i, dtype=np.uint16) * 7 + i).astype(np.uint16)


def _litdata_tokens(root: Path) -> dict[str, Any]:
    optimize(fn=_tokens, inputs=list(range(60)), output_dir=str(root / "tok"),
             chunk_size=4096, item_loader=TokensLoader(), num_workers=1, verbose=False)  # fmt: skip
    return {"format": "litdata", "inputs": (str(root / "tok"),), "seq_len": 16}


def _hf(root: Path) -> dict[str, Any]:
    """A saved dataset (strings, binaries, ints, bools, floats, a ClassLabel; one null,
    whose batch goes row by row) and a Parquet file of large strings and binaries."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 2_100
    columns: dict[str, list[Any]] = {
        "text": [f"row {i} ✓" * (i % 4) for i in range(n)],
        "blob": [bytes([i % 256]) * (i % 50) for i in range(n)],
        "count": [i * 7919 - 5000 for i in range(n)],
        "flag": [i % 3 == 0 for i in range(n)],
        "score": [i / 7 for i in range(n)],
        "label": [i % 2 for i in range(n)],
    }
    columns["text"][1_500] = None  # type: ignore[call-overload]
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "blob": datasets.Value("binary"),
            "count": datasets.Value("int32"),
            "flag": datasets.Value("bool"),
            "score": datasets.Value("float32"),
            "label": datasets.ClassLabel(names=["no", "yes"]),
        }
    )
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(root / "hf"))
    large = pa.table(
        {
            "text": pa.array(["p", "ü" * 3, ""] * 100, pa.large_string()),
            "blob": pa.array([b"x", b"", b"yz"] * 100, pa.large_binary()),
            "count": pa.array(range(300), pa.int64()),
            "flag": pa.array([True, False, True] * 100),
            "score": pa.array([0.5] * 300, pa.float64()),
            "label": pa.array([1, 0, 1] * 100, pa.int64()),
        }
    )
    pq.write_table(large, root / "large.parquet", row_group_size=128)
    return {
        "format": "hf",
        "inputs": (str(root / "hf"), str(root / "large.parquet")),
        "skip_bad": True,
    }


def _tfrecords(root: Path) -> dict[str, Any]:
    return {"format": "tfrecord", "inputs": (write_tfrecord(root),), "part_bytes": 3000}


def _webdataset(root: Path) -> dict[str, Any]:
    samples = webdataset_samples(70)
    del samples[33]["txt"]
    return {
        "format": "webdataset",
        "inputs": (write_webdataset(root / "wds", samples),),
        "skip_bad": True,
    }


SOURCES = {
    "hf": _hf,
    "lmdb-raw": _lmdb_raw,
    "lmdb-pickle": _lmdb_pickle,
    "litdata": _litdata,
    "litdata-tokens": _litdata_tokens,
    "tfrecord": _tfrecords,
    "webdataset": _webdataset,
}


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_imports_are_the_same_bytes_in_bulk_and_record_by_record(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = SOURCES[source](tmp_path)

    def run(name: str) -> dict[str, bytes]:
        out = tmp_path / name
        build_import(ImportConfig(output=str(out), **options, **SMALL))
        return dir_bytes(out)

    bulk = run("bulk")
    with monkeypatch.context() as patch:  # the format's records, grouped by the build
        for module in (hf_format, lmdb_format, litdata_format, tfrecord_format):
            patch.setattr(module, "FORMAT", replace(module.FORMAT, read_batches=None))
        grouped = run("grouped")
    with monkeypatch.context() as patch:  # every record on its own
        patch.setattr(unit, "encode_batch", lambda codecs, batch: None)
        single = run("single")
    assert bulk == grouped == single
    assert any(name.startswith("shard.") for name in bulk) and "index.json" in bulk
