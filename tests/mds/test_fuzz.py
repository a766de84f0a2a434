"""Fuzzing the codec: a mutated index.json or shard file fails only with FormatError.

Real datasets written by our writer (variable- and fixed-size columns, raw and zstd) are
mutated by hypothesis: index documents field by field (types, huge and negative integers,
missing and extra keys, wrong encodings, odd column names, hashes, sizes) and as raw text;
shard files byte by byte (truncation, flips, zeroed regions, a garbled offsets table).
Opening, reading, gathering and verifying must then either raise the project's
:class:`FormatError` (corrupt shard, hash mismatch, unsupported encoding are subclasses),
or succeed; when hashes are checked, success must mean the original samples.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import CorruptShardError, FormatError
from shardstream.mds import (
    MDSIndex,
    MDSWriter,
    ShardInfo,
    ShardReader,
    decompress_shard,
    encoded_size,
    load_index,
    verify_range,
    write_shard_arrays,
)
from tests.mds.conftest import (
    ALL_COLUMNS,
    FIXED_COLUMNS,
    assert_sample_equal,
    fixed_samples,
    make_fixed,
    make_sample,
)

BLOCK = 4096
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Dataset:
    """A dataset on disk with its index text and every sample, shard by shard."""

    def __init__(self, root: Path, samples: list[list[dict[str, Any]]]) -> None:
        self.root = root
        self.index_text = (root / "index.json").read_text()
        self.index = load_index(root / "index.json")
        self.samples = samples
        self.files = {p.name: p.read_bytes() for p in root.iterdir()}
        self.raw: list[bytes] = []  # each shard's uncompressed bytes
        for shard in self.index.shards:
            path = root / shard.raw_data.basename
            if shard.compression is not None:
                decompress_shard(root / shard.stored.basename, path, shard.compression)
            self.raw.append(path.read_bytes())
            if shard.compression is not None:
                path.unlink()


def _split(index: MDSIndex, samples: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out, start = [], 0
    for shard in index.shards:
        out.append(samples[start : start + shard.samples])
        start += shard.samples
    return out


@pytest.fixture(scope="module", params=["varsize", "fixed", "zstd"])
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "fixed":
        arrays = make_fixed(200)
        shards = [
            write_shard_arrays(
                root,
                f"shard.{k:05}.mds",
                FIXED_COLUMNS,
                {n: a[s : s + 100] for n, a in arrays.items()},
                block_size=BLOCK,
            )
            for k, s in enumerate(range(0, 200, 100))
        ]
        MDSIndex(shards).write(root / "index.json")
        return Dataset(root, _split(MDSIndex(shards), list(fixed_samples(arrays))))
    samples = [make_sample(i) for i in range(12) if i != 5]  # 5 has a 70,000-element array
    compression = "zstd" if request.param == "zstd" else None
    with MDSWriter(
        root, ALL_COLUMNS, size_limit=30_000, block_size=BLOCK, compression=compression
    ) as writer:
        for sample in samples:
            writer.write(sample)
    return Dataset(root, _split(writer.index, samples))


def read_shard(path: Path, shard: ShardInfo | None, *, verify: bool) -> list[dict[str, Any]]:
    """Open, read every sample and gather every fixed-size column, as a client would.

    ``verify=False``: each sample and column is tried on its own (one corrupt sample must
    not hide what reading the next one does); the samples that read are returned.
    """
    allowed = () if verify else (FormatError,)
    with ShardReader(path, shard, verify=verify) as reader:
        got = []
        for i in range(len(reader)):
            with contextlib.suppress(*allowed):
                got.append(reader[i])
        backwards = np.arange(len(reader))[::-1]
        for name, encoding in reader.columns.items():
            if encoded_size(encoding) is None:
                continue
            with contextlib.suppress(*allowed):
                gathered = reader.gather(name, backwards)
                assert np.array_equal(reader.column(name)[backwards], gathered, equal_nan=True)
            with contextlib.suppress(*allowed):
                reader.gather(name, np.array([len(reader) - 1, 0]) if len(reader) else [])
    return got


def read_dataset(ds: Dataset, index_text: bytes, scratch: Path) -> None:
    """Load a (mutated) index and read every shard it lists; check data when it succeeds."""
    index = load_index(index_text)
    original = {s.stored.basename: i for i, s in enumerate(ds.index.shards)}
    for shard in index.shards:
        stored = ds.root / shard.stored.basename
        if not stored.is_file():
            continue  # a missing object is the store's error (ObjectNotFoundError), not ours
        path = stored
        if shard.compression is not None:
            path = scratch / "raw.mds"
            decompress_shard(stored, path, shard.compression, expected_size=shard.raw_data.bytes)
        got = read_shard(path, shard, verify=True)
        if shard.block_digests is not None:
            verify_range(shard, 0, path.read_bytes())
        # One mutation cannot both skip the hash check and point at other bytes, and the
        # reader checks the header's columns against the entry: these are the originals.
        k = original[shard.stored.basename]
        assert len(got) == len(ds.samples[k])
        for mine, want in zip(got, ds.samples[k], strict=True):
            assert_sample_equal(mine, want)


# --- index.json documents ----------------------------------------------------------------

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, -1, 7, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, -(2**63), 2**64]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "",
            "mds",
            "zstd",
            "zstd:99",
            "gz",
            "pkl",
            "ndarray:uint8:0",
            "ndarray:uint8:99999999999,99999999999",
            "ndarray:float128",
            "str",
            "int",
            "uint16",
            "shard.00001.mds",
            "../../etc/passwd",
            "/abs/shard.mds",
            "a/./b",
            "shard.00000.mds/",
            "nul\x00name",
            "x" * 5000,
            "é✓",
            "blocks:xxh3_64:4096",
            "0" * 16,
        ]
    ),
    st.text(max_size=20),
    st.lists(st.integers(-3, 3) | st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    st.recursive(st.just([]), lambda inner: st.lists(inner, max_size=1), max_leaves=2),
)


_DEEP = "\x00deeply nested\x00"


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value in a JSON document."""
    out = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _paths(value, (*prefix, i))
    return out


def _mutate_doc(doc: Any, draw: Callable[[Any], Any]) -> Any:
    """One structural mutation of the parsed index at a random path."""
    paths = _paths(doc)
    path = draw(st.sampled_from(paths))
    action = draw(st.sampled_from(["replace", "delete", "add", "rename", "dup", "deep"]))
    if not path:
        return draw(ODD_VALUES) if action == "replace" else doc
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "replace":
        parent[last] = draw(ODD_VALUES)
    elif action == "delete":
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["extra", "blocks:xxh3_64:1", "", "Samples"]))] = draw(
            ODD_VALUES
        )
    elif action == "add" and isinstance(parent, list):
        parent.insert(draw(st.integers(0, len(parent))), draw(ODD_VALUES))
    elif action == "rename" and isinstance(parent, dict):
        parent[draw(st.text(max_size=8))] = parent.pop(last)
    elif action == "dup" and isinstance(parent, list):
        parent.append(parent[last])
    elif action == "deep":
        parent[last] = _DEEP  # json.dumps cannot nest that deep: spliced in as text
    return doc


@st.composite
def mutated_index(draw: Callable[[Any], Any], text: str) -> bytes:
    """The index text after one mutation: of its JSON structure, or of its bytes."""
    kind = draw(st.sampled_from(["doc", "doc", "doc", "doc", "bytes", "encoding"]))
    if kind == "doc":
        doc = _mutate_doc(json.loads(text), draw)
        depth = draw(st.sampled_from([10, 3000]))
        out = json.dumps(doc, sort_keys=draw(st.booleans()))
        return out.replace(json.dumps(_DEEP), "[" * depth + "]" * depth).encode()
    if kind == "encoding":
        codec = draw(st.sampled_from(["utf-16", "utf-32", "latin-1"]))
        return text.replace('"str"', '"strä"').encode(codec)
    data = bytearray(text.encode())
    pos = draw(st.integers(0, len(data) - 1))
    op = draw(st.sampled_from(["truncate", "flip", "insert"]))
    if op == "truncate":
        return bytes(data[:pos])
    if op == "flip":
        data[pos] ^= draw(st.integers(1, 255))
    else:
        data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


@FUZZ
@given(data=st.data())
def test_mutated_index_raises_only_format_errors(dataset: Dataset, data: st.DataObject) -> None:
    index_text = data.draw(mutated_index(dataset.index_text))
    with tempfile.TemporaryDirectory() as scratch, contextlib.suppress(FormatError):
        read_dataset(dataset, index_text, Path(scratch))


# --- shard bytes ---------------------------------------------------------------------------


@st.composite
def mutated_shard(draw: Callable[[Any], Any], data: bytes, *, mds: bool) -> bytes:
    """The file's bytes after one mutation (``mds``: also of the MDS header and samples)."""
    out = bytearray(data)
    n = int.from_bytes(data[:4], "little")
    ops = ["truncate", "flip", "append"] + (["offset", "short", "count", "sizes"] if mds else [])
    op = draw(st.sampled_from(ops))
    if op == "truncate":
        return bytes(out[: draw(st.integers(0, len(out) - 1))])
    if op == "flip":
        pos = draw(st.integers(0, len(out) - 1))
        out[pos] ^= draw(st.integers(1, 255))
    elif op == "offset":
        offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(int)
        k = draw(st.integers(0, n))
        # Next to a neighbour's offset: samples a few bytes long, or overlapping by a few.
        near = [int(offsets[max(k - 1, 0)]) + d for d in range(-2, 9)]
        near += [int(offsets[min(k + 1, n)]) - d for d in range(-2, 9)]
        special = st.sampled_from([0, 1, 2**32 - 1, len(data) - 1, len(data) + 1, *near])
        value = draw(special | st.integers(0, 2**32 - 1)) % 2**32
        out[4 + 4 * k : 8 + 4 * k] = value.to_bytes(4, "little")
    elif op == "short":  # sample k keeps only its last few bytes; sample k - 1 grows
        offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(int)
        k = draw(st.integers(0, n - 1))
        value = int(offsets[k + 1]) - draw(st.integers(0, 12))
        out[4 + 4 * k : 8 + 4 * k] = value.to_bytes(4, "little")
    elif op == "count":
        special = st.sampled_from([0, n - 1, n + 1, 2**30, 2**32 - 1])
        out[:4] = draw(special | st.integers(0, 2**32 - 1)).to_bytes(4, "little")
    elif op == "append":
        out += draw(st.binary(min_size=1, max_size=64))
    else:  # garble the start of a sample: variable-size columns' sizes live there
        offsets = np.frombuffer(data, "<u4", n + 1, 4)
        k = draw(st.integers(0, n - 1))
        pos = int(offsets[k])
        out[pos : pos + 4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
    return bytes(out)


def _zero_region(draw: Callable[[Any], Any], data: bytes) -> bytes:
    out = bytearray(data)
    start = draw(st.integers(0, len(out) - 1))
    length = draw(st.integers(1, 4 * BLOCK))
    end = min(start + length, len(out))
    out[start:end] = bytes(end - start)
    return bytes(out)


@FUZZ
@given(data=st.data())
def test_mutated_shard_raises_only_format_errors(dataset: Dataset, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(dataset.index.shards) - 1))
    shard = dataset.index.shards[k]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        stored = scratch / shard.stored.basename
        original = dataset.files[shard.stored.basename]
        if data.draw(st.booleans(), label="zero a region"):
            mutated = _zero_region(data.draw, original)
        else:
            mutated = data.draw(mutated_shard(original, mds=shard.compression is None))
        stored.write_bytes(mutated)
        path = stored
        if shard.compression is not None:
            path = scratch / "raw.mds"
            try:
                decompress_shard(
                    stored, path, shard.compression, expected_size=shard.raw_data.bytes
                )
            except FormatError:
                return
        raw = path.read_bytes()
        # Checked against the index: any change is an error, no change reads the original.
        try:
            got = read_shard(path, shard, verify=True)
        except FormatError:
            assert raw != dataset.raw[k]
        else:
            assert raw == dataset.raw[k]
            for mine, want in zip(got, dataset.samples[k], strict=True):
                assert_sample_equal(mine, want)
        # Unchecked, with and without the index entry: wrong values are possible, any other
        # exception type is not.
        for info in (shard, None):
            with contextlib.suppress(FormatError):
                read_shard(path, info, verify=False)
        digests = shard.block_digests
        if digests is not None:
            whole = dataset.raw[k]
            for block in range(digests.num_blocks):
                lo, hi = digests.span(block)
                if hi > len(raw):
                    break
                try:
                    verify_range(shard, lo, raw[lo:hi])
                except CorruptShardError:
                    assert raw[lo:hi] != whole[lo:hi]
                else:
                    assert raw[lo:hi] == whole[lo:hi]


# --- the two raw errors issue 10 reported ----------------------------------------------------


def test_huge_sample_count_is_a_format_error(dataset: Dataset) -> None:
    doc = json.loads(dataset.index_text)
    doc["shards"][0]["samples"] = 2**63
    with pytest.raises(
        FormatError, match=r"shard 0 \(shard\.00000.*'samples' is 9223372036854775808"
    ):
        load_index(json.dumps(doc).encode())


def test_sample_read_past_the_end_is_corrupt(tmp_path: Path) -> None:
    """A last sample too short for its column sizes: once struct.error, now CorruptShardError."""
    with MDSWriter(tmp_path, {"a": "str", "b": "bytes"}, block_size=None) as writer:
        writer.write({"a": "x", "b": b"y"})
    path = tmp_path / "shard.00000.mds"
    data = bytearray(path.read_bytes())
    # Cut the sample to 2 bytes (its two uint32 sizes need 8) and fix the offsets to match.
    first = int.from_bytes(data[4:8], "little")
    del data[first + 2 :]
    data[8:12] = len(data).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    reader = ShardReader(path)
    with pytest.raises(CorruptShardError, match=r"shard\.00000\.mds: sample 0 has 2 bytes"):
        reader[0]
