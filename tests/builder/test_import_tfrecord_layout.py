"""The TFRecord batch path against the record-by-record one, on random inputs.

``parse_batch`` (many Examples of one layout at once, with numpy) must give exactly the
columns ``parse_example`` gives each record, or decline; ``read_batches`` must give
exactly ``read``'s records and then ``read``'s error, for intact and damaged files.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tfrecord import example_pb2

from shardstream.errors import InputError
from shardstream.shard_builder.importers import tfrecord
from shardstream.shard_builder.importers.source import SourceUnit
from shardstream.shard_builder.importers.tfrecord_layout import layout_of, parse_batch

KINDS = ("bytes", "int64", "float")


def _example(features: dict[str, tuple[str, list[Any]]]) -> bytes:
    example = example_pb2.Example()
    for key, (kind, values) in features.items():
        feature = example.features.feature[key]
        if kind == "bytes":
            feature.bytes_list.value.extend(values)
        elif kind == "int64":
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(values)
    return example.SerializeToString()


def _values(rng: random.Random, kind: str, count: int) -> list[Any]:
    if kind == "bytes":
        return [rng.randbytes(rng.choice([0, 1, 5, 127, 128, 300, 20_000]))]
    if kind == "int64":
        big = [0, 1, 127, 128, 16_383, 16_384, 2**31, 2**62, 2**63 - 1, -1, -(2**63), -300]
        return [rng.choice(big) if rng.random() < 0.5 else rng.randint(-10**6, 10**6)
                for _ in range(count)]  # fmt: skip
    return [rng.choice([0.0, -1.5, 1e30, float("inf"), float("nan"), rng.random()])
            for _ in range(count)]  # fmt: skip


def _records(rng: random.Random, n: int) -> list[bytes]:
    """``n`` Examples of one random layout (the usual case), sometimes with list lengths
    that change from record to record."""
    keys = [rng.choice(["image", "label", "é", "x" * 200, f"f{i}"]) + str(i) for i in range(4)]
    layout = {key: rng.choice(KINDS) for key in keys[: rng.randint(1, 4)]}
    fixed = {key: rng.choice([0, 1, 3]) for key in layout}
    varying = rng.random() < 0.3
    return [
        _example({
            key: (kind, _values(rng, kind, rng.randint(1, 4) if varying else fixed[key]))
            for key, kind in layout.items()
        })
        for _ in range(n)
    ]  # fmt: skip


def _same(got: tuple[str, Any], want: tuple[str, Any]) -> None:
    assert got[0] == want[0]
    if want[0] == "ndarray":
        assert got[1].dtype == want[1].dtype and got[1].shape == want[1].shape
        assert got[1].tobytes() == want[1].tobytes()  # NaN payloads too
    elif want[0] == "bytes":
        assert type(want[1]) is bytes and bytes(got[1]) == want[1]
    else:
        assert got[1] == want[1]


def _check(records: list[bytes], rng: random.Random) -> bool:
    """Compare ``parse_batch`` with ``parse_example`` on ``records`` laid out in one
    buffer with random gaps; whether the batch path took them."""
    buf, starts, ends = b"", [], []
    for record in records:
        buf += rng.randbytes(rng.choice([0, 3, 12]))
        starts.append(len(buf))
        buf += record
        ends.append(len(buf))
    buf += rng.randbytes(rng.choice([0, 7]))
    layout = layout_of(buf, starts[0], ends[0])
    columns = parse_batch(buf, starts, ends, layout) if layout else None
    if columns is None:
        return False
    for i, record in enumerate(records):
        want = tfrecord.parse_example(record)  # raises if the batch path took a bad record
        assert list(columns) == list(want)
        for name, (encoding, values) in columns.items():
            _same((encoding, values[i]), want[name])
    return True


@pytest.mark.parametrize("seed", range(40))
def test_batches_of_one_layout_parse_as_each_record_does(seed: int) -> None:
    rng = random.Random(seed)
    records = _records(rng, rng.randint(1, 50))
    assert _check(records, rng)  # protobuf's own serialization: always the batch path


@pytest.mark.parametrize("seed", range(300))
def test_damaged_or_unusual_records_are_declined_or_parsed_alike(seed: int) -> None:
    rng = random.Random(seed)
    records = _records(rng, rng.randint(1, 8))
    i = rng.randrange(len(records))
    record = bytearray(records[i])
    change = rng.choice(["flip", "cut", "insert", "swap"])
    at = rng.randrange(len(record)) if record else 0
    if change == "flip" and record:
        record[at] = rng.choice([0x00, 0x0A, 0x12, 0x1A, 0x80, 0xFF, record[at] ^ 1])
    elif change == "cut":
        del record[at:]
    elif change == "insert":
        record[at:at] = rng.randbytes(rng.randint(1, 3))
    elif len(records) > 1:  # another record's bytes: another layout or other lengths
        record = bytearray(records[(i + 1) % len(records)])
    records[i] = bytes(record)
    try:
        for r in records:
            tfrecord.parse_example(r)
    except (ValueError, IndexError, UnicodeDecodeError):
        # A record the general parser rejects must never be taken by the batch path.
        buf = b"".join(records)
        ends = np.cumsum([len(r) for r in records]).tolist()
        starts = [0, *ends[:-1]]
        layout = layout_of(buf, starts[0], ends[0])
        assert layout is None or parse_batch(buf, starts, ends, layout) is None
        return
    _check(records, rng)


def test_unusual_but_valid_layouts_go_record_by_record() -> None:
    plain = _example({"a": ("int64", [5, 6]), "b": ("bytes", [b"x"])})
    two_values = _example({"a": ("int64", [5, 6]), "b": ("bytes", [b"x", b"y"])})
    # The same two map entries in the other order (short messages: one-byte lengths).
    first = 4 + plain[3]
    reordered = plain[:2] + plain[first:] + plain[2:first]
    assert reordered != plain and len(reordered) == len(plain)
    assert {
        k: v[1].tolist() if k == "a" else v for k, v in tfrecord.parse_example(reordered).items()
    } == {"a": [5, 6], "b": ("bytes", b"x")}
    assert _check([plain, plain], random.Random(0))
    for other in (two_values, reordered):
        buf = plain + other
        layout = layout_of(buf, 0, len(plain))
        assert layout is not None
        assert parse_batch(buf, [0, len(plain)], [len(plain), len(buf)], layout) is None
    # A record with one feature more than the layout.
    entry = _example({"c": ("float", [1.0])})[2:]  # its one map entry
    extra = plain[:1] + bytes([plain[1] + len(entry)]) + plain[2:] + entry
    assert list(tfrecord.parse_example(extra)) == [*tfrecord.parse_example(plain), "c"]
    buf = plain + extra
    layout = layout_of(buf, 0, len(plain))
    assert layout is not None
    assert parse_batch(buf, [0, len(plain)], [len(plain), len(buf)], layout) is None
    # int64s written unpacked (a field per value), as an old writer may: [5, 6] all the same.
    packed = _example({"a": ("int64", [5, 6])})
    unpacked = bytes.fromhex("0a0d0a0b0a016112061a0408050806")
    assert tfrecord.parse_example(unpacked)["a"][1].tolist() == [5, 6]
    buf = packed + unpacked
    layout = layout_of(buf, 0, len(packed))
    assert layout is not None
    assert parse_batch(buf, [0, len(packed)], [len(packed), len(buf)], layout) is None
    assert layout_of(unpacked, 0, len(unpacked)) is not None  # same layout, other lists


def _write_file(path: Path, records: list[bytes]) -> None:
    with open(path, "wb") as fh:
        for data in records:
            length = struct.pack("<Q", len(data))
            fh.write(length + struct.pack("<I", tfrecord.masked_crc(length)))
            fh.write(data + struct.pack("<I", tfrecord.masked_crc(data)))


def _outcome(records: Any) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    got: list[tuple[str, dict[str, Any]]] = []
    try:
        for where, sample in records:
            got.append((where, {k: (e, v) for k, (e, v) in sample.items()}))
    except InputError as exc:
        return got, str(exc)
    return got, ""


@pytest.mark.parametrize("seed", range(60))
def test_read_batches_gives_reads_records_and_errors(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    monkeypatch.setattr(tfrecord, "BATCH_RECORDS", rng.choice([1, 3, 16]))
    records = _records(rng, rng.randint(1, 40))
    if rng.random() < 0.3:  # a record of another layout in the middle
        records.insert(rng.randrange(len(records)), _example({"z": ("bytes", [b"q", b"r"])}))
    path = tmp_path / "data.tfrecord"
    _write_file(path, records)
    data = bytearray(path.read_bytes())
    if rng.random() < 0.7 and data:  # damage: a flipped byte, or the file cut short
        if rng.random() < 0.5:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            del data[rng.randrange(len(data)) :]
    path.write_bytes(bytes(data))
    unit = SourceUnit(str(path), len(data))
    parts = tfrecord.split(unit, rng.choice([64, 4096, 1 << 30]))
    for part in parts:
        want, want_error = _outcome(tfrecord.read(part))
        batches = tfrecord.read_batches(part)
        got, got_error = _outcome(r for batch in batches for r in batch.records())
        assert got_error == want_error
        assert [w for w, _ in got] == [w for w, _ in want]
        for (_, g), (_, w) in zip(got, want, strict=True):
            assert list(g) == list(w)
            for name in w:
                _same(g[name], w[name])


def test_a_ten_byte_varint_with_bits_past_64_is_read_as_protobuf_reads_it() -> None:
    record = _example({"a": ("int64", [-1, 7])})
    assert bytes.fromhex("ffffffffffffffffff01") in record
    odd = record.replace(
        bytes.fromhex("ffffffffffffffffff01"), bytes.fromhex("ffffffffffffffffff7f")
    )
    parsed = example_pb2.Example.FromString(odd).features.feature["a"].int64_list.value
    assert list(parsed) == [-1, 7]
    assert tfrecord.parse_example(odd)["a"][1].tolist() == [-1, 7]
    assert _check([record, odd, odd], random.Random(0))
