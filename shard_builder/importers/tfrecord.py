"""TFRecord files of ``tf.train.Example`` records, read without TensorFlow.

Framing (per record): ``uint64 length``, ``uint32 masked CRC32C(length)``, ``data``,
``uint32 masked CRC32C(data)``; both checksums are verified. The ``Example`` protobuf is
parsed here (it has three message types). Features become columns: an ``int64_list`` ->
``ndarray`` of int64, a ``float_list`` -> ``ndarray`` of float32 (the lists keep their
length, so variable-length features stay exact), a ``bytes_list`` with one value -> bytes,
with any other count -> json list of UTF-8 strings. No index files are needed: a file
bigger than a part is split at record boundaries found from the 12-byte record headers.

The parser walks the message by byte offsets (one list of field offsets per message, no
slicing until a value is taken), and a part is read with one ``read`` call: the per-record
Python work is what bounds this import, so it is kept to a few calls per feature.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import google_crc32c
import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import Column, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.inputs import resolve_inputs

_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_U32 = struct.Struct("<I")


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    files = resolve_inputs(inputs, _SUFFIXES)
    return [SourceUnit(str(f.path), f.size, f.mtime_ns) for f in files]


def split(unit: SourceUnit, part_bytes: int) -> list[SourceUnit]:
    """``unit`` as byte ranges ``span = (first byte, first record number, end byte)`` of
    about ``part_bytes``, cut at record boundaries (read from the record headers alone); a
    file of at most ``part_bytes`` stays whole."""
    if unit.nbytes <= part_bytes:
        return [unit]
    parts: list[SourceUnit] = []
    first = offset = number = first_number = 0
    with open(unit.path, "rb", buffering=0) as f:
        while offset < unit.nbytes:
            if offset - first >= part_bytes:
                parts.append(
                    replace(
                        unit,
                        nbytes=offset - first,
                        span=(first, first_number, offset),
                        first=first_number,
                    )
                )
                first, first_number = offset, number
            head = os.pread(f.fileno(), 8, offset)
            if len(head) < 8:
                break  # a truncated header: reading the last part reports it
            offset += 16 + struct.unpack("<Q", head)[0]
            number += 1
    end = max(offset, unit.nbytes)  # a record running past the end: reported when read
    parts.append(
        replace(unit, nbytes=end - first, span=(first, first_number, end), first=first_number)
    )
    return parts


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it."""
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
        shift += 7


def _fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, start, stop)`` of each field of the message in
    ``buf[pos:end]``; the value is ``buf[start:stop]`` (for wire type 0, the varint)."""
    out = []
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            size, start = _varint(buf, pos)
            pos = start + size
        elif wire == 0:
            start = pos
            pos = _varint(buf, pos)[1]
        elif wire == 5:
            start, pos = pos, pos + 4
        elif wire == 1:
            start, pos = pos, pos + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end:
            raise ValueError("protobuf message runs past its end")
        out.append((tag >> 3, wire, start, pos))
    return out


def _int64s(buf: bytes, pos: int, end: int) -> np.ndarray[Any, Any]:
    values: list[int] = []
    if pos < end and buf[pos] == 0x0A:  # one packed run, the usual layout
        size, start = _varint(buf, pos + 1)
        if start + size == end:
            while start < end:
                value, start = _varint(buf, start)
                values.append(value)
            pos = end
    for _, wire, start, stop in _fields(buf, pos, end):
        if wire == 2:  # packed
            at = start
            while at < stop:
                value, at = _varint(buf, at)
                values.append(value)
        else:
            values.append(_varint(buf, start)[0])
    # Negative int64 values are 10-byte varints of their two's complement.
    return np.array([v - (1 << 64) if v >> 63 else v for v in values], dtype=np.int64)


def _floats(buf: bytes, pos: int, end: int) -> np.ndarray[Any, Any]:
    # Packed runs or single fixed32 values: either way little-endian float32 bytes.
    parts = [buf[start:stop] for _, _, start, stop in _fields(buf, pos, end)]
    return np.frombuffer(b"".join(parts), dtype="<f4").astype(np.float32)


def _feature(buf: bytes, pos: int, end: int) -> Column:
    """A ``Feature`` message: its one list, as a column."""
    if pos < end and buf[pos] in (0x0A, 0x12, 0x1A):  # one list, the usual layout
        size, start = _varint(buf, pos + 1)
        if start + size == end:
            return _list(buf[pos] >> 3, buf, start, end)
    for kind, _, start, stop in _fields(buf, pos, end):
        if kind in (1, 2, 3):
            return _list(kind, buf, start, stop)
    return "json", []  # a feature with no list set


def _list(kind: int, buf: bytes, pos: int, end: int) -> Column:
    """A ``BytesList`` (1), ``FloatList`` (2) or ``Int64List`` (3) in ``buf[pos:end]``."""
    if kind == 1:
        items = []
        while pos < end and buf[pos] == 0x0A:
            size, start = _varint(buf, pos + 1)
            pos = start + size
            items.append(buf[start:pos])
        if pos != end:  # not only values: the general walk (and its errors)
            items = [buf[a:b] for _, _, a, b in _fields(buf, pos, end)]
        if len(items) == 1:
            return "bytes", items[0]
        return "json", [item.decode("utf-8") for item in items]
    if kind == 2:
        return "ndarray", _floats(buf, pos, end)
    return "ndarray", _int64s(buf, pos, end)


def _entry(buf: bytes, pos: int, end: int) -> tuple[str, Column]:
    """A ``Features.feature`` map entry: ``(name, column)``."""
    name, feature = "", (0, 0)
    for k, _, a, b in _fields(buf, pos, end):
        if k == 1:
            name = buf[a:b].decode("utf-8")
        elif k == 2:
            feature = (a, b)
    return name, _feature(buf, *feature)


def parse_example(data: bytes) -> dict[str, Column]:
    """The columns of one serialized ``tf.train.Example``.

    Map entries written the usual way (key, then value, each length-delimited with a
    one-byte tag) take a short path that reads them in place; anything else (fields in
    another order, unknown fields) goes through the general field walk.
    """
    out: dict[str, Column] = {}
    for number, _, start, stop in _fields(data, 0, len(data)):
        if number != 1:
            continue
        pos = start
        while pos < stop:
            if data[pos] != 0x0A:  # not a map entry: let the general walk sort it out
                for entry, _, a, b in _fields(data, pos, stop):
                    if entry == 1:
                        name, column = _entry(data, a, b)
                        out[name] = column
                break
            size, entry_start = _varint(data, pos + 1)
            pos = entry_start + size
            if data[entry_start] == 0x0A:
                key_size, key_start = _varint(data, entry_start + 1)
                value_at = key_start + key_size
                if value_at < pos and data[value_at] == 0x12:
                    value_size, value_start = _varint(data, value_at + 1)
                    if value_start + value_size == pos:
                        name = data[key_start:value_at].decode("utf-8")
                        out[name] = _feature(data, value_start, pos)
                        continue
            name, column = _entry(data, entry_start, pos)
            out[name] = column
    return out


def read(unit: SourceUnit) -> Iterator[Record]:
    first, number, end = unit.span or (0, 0, unit.nbytes)
    with open(unit.path, "rb") as f:
        f.seek(first)
        buf = f.read(end - first)  # one read per part (parts are about PART_BYTES)
    pos, size = 0, len(buf)
    while pos < size:
        label = f"{unit.path} record {number}"
        where = f"{label} (byte {first + pos})"
        if size - pos < 12:
            raise InputError(f"{where}: truncated record header")
        length, length_crc = _HEAD.unpack_from(buf, pos)
        if length_crc != masked_crc(buf[pos : pos + 8]):
            raise InputError(f"{where}: bad CRC of the record length (damaged file)")
        start = pos + 12
        pos = start + length + 4
        if pos > size:
            raise InputError(f"{where}: truncated record ({length} bytes announced)")
        data = buf[start : start + length]
        if _U32.unpack_from(buf, pos - 4)[0] != masked_crc(data):
            raise InputError(f"{where}: bad CRC of the record data (damaged file)")
        try:
            sample = parse_example(data)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: not a tf.train.Example ({exc})") from exc
        yield label, sample
        number += 1


FORMAT = ImportFormat("tfrecord", plan, read, split=split)
