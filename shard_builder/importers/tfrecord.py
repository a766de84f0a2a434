"""TFRecord files of ``tf.train.Example`` records, read without TensorFlow.

Framing (per record): ``uint64 length``, ``uint32 masked CRC32C(length)``, ``data``,
``uint32 masked CRC32C(data)``; both checksums are verified. The ``Example`` protobuf is
parsed here (it has three message types). Features become columns: an ``int64_list`` ->
``ndarray`` of int64, a ``float_list`` -> ``ndarray`` of float32 (the lists keep their
length, so variable-length features stay exact), a ``bytes_list`` with one value -> bytes,
with any other count -> json list of UTF-8 strings. No index files are needed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import google_crc32c
import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import Column, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.inputs import resolve_inputs

_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    files = resolve_inputs(inputs, _SUFFIXES)
    return [SourceUnit(str(f.path), f.size, f.mtime_ns) for f in files]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of a protobuf message (value: int or bytes)."""
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("protobuf message runs past its end")
        yield tag >> 3, wire, value


def _int64s(body: bytes) -> np.ndarray[Any, Any]:
    values: list[int] = []
    for _, wire, value in _fields(body):
        if wire == 2:  # packed
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos)
                values.append(v)
        else:
            values.append(value)
    return np.array(values, dtype=np.uint64).astype(np.int64)


def _floats(body: bytes) -> np.ndarray[Any, Any]:
    parts = [value for _, _, value in _fields(body)]  # packed bytes or single fixed32
    return np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32)


def parse_example(data: bytes) -> dict[str, Column]:
    """The columns of one serialized ``tf.train.Example``."""
    out: dict[str, Column] = {}
    for number, _, features in _fields(data):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(features):
            if entry_number != 1:
                continue
            name, feature = "", b""
            for k, _, v in _fields(entry):
                if k == 1:
                    name = bytes(v).decode("utf-8")
                elif k == 2:
                    feature = v
            out[name] = _feature(feature)
    return out


def _feature(feature: bytes) -> Column:
    for kind, _, body in _fields(feature):
        if kind == 1:
            items = [bytes(v) for _, _, v in _fields(body)]
            if len(items) == 1:
                return "bytes", items[0]
            return "json", [item.decode("utf-8") for item in items]
        if kind == 2:
            return "ndarray", _floats(body)
        if kind == 3:
            return "ndarray", _int64s(body)
    return "json", []  # a feature with no list set


def read(unit: SourceUnit) -> Iterator[Record]:
    with open(unit.path, "rb") as f:
        number, offset = 0, 0
        while True:
            head = f.read(12)
            if not head:
                return
            where = f"{unit.path} record {number} (byte {offset})"
            if len(head) < 12:
                raise InputError(f"{where}: truncated record header")
            (length,) = struct.unpack("<Q", head[:8])
            if struct.unpack("<I", head[8:])[0] != masked_crc(head[:8]):
                raise InputError(f"{where}: bad CRC of the record length (damaged file)")
            data = f.read(length)
            tail = f.read(4)
            if len(data) < length or len(tail) < 4:
                raise InputError(f"{where}: truncated record ({length} bytes announced)")
            if struct.unpack("<I", tail)[0] != masked_crc(data):
                raise InputError(f"{where}: bad CRC of the record data (damaged file)")
            try:
                sample = parse_example(data)
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                raise InputError(f"{where}: not a tf.train.Example ({exc})") from exc
            yield f"{unit.path} record {number}", sample
            number += 1
            offset += 16 + length


FORMAT = ImportFormat("tfrecord", plan, read)
