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

import functools
import os
import struct
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import google_crc32c
import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.columnar import BATCH_RECORDS, columnize
from shardstream.shard_builder.importers.source import (
    Batch,
    Column,
    ImportFormat,
    Record,
    SourceUnit,
)
from shardstream.shard_builder.importers.tfrecord_layout import Feature, layout_of, parse_batch
from shardstream.shard_builder.inputs import resolve_inputs

_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")
_MASK_DELTA = 0xA282EAD8
_HEAD = struct.Struct("<QI")
_U32 = struct.Struct("<I")
_U64_MASK = (1 << 64) - 1


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data``."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    files = resolve_inputs(inputs, _SUFFIXES, confined=True)
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
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else unit.nbytes
            if length > unit.nbytes - offset - 16:
                break  # a truncated header or record: reading the last part reports it
            offset += 16 + length
            number += 1
    end = max(offset, unit.nbytes)  # a record running past the end: reported when read
    parts.append(
        replace(unit, nbytes=end - first, span=(first, first_number, end), first=first_number)
    )
    return parts


_VARINT_BYTES = 10  # a protobuf varint holds at most 64 bits: 10 bytes of 7


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it.

    At most 10 bytes are read: a longer run of continuation bytes is an error, not a
    bigger number (growing a Python int by 7 bits per byte made a 1 MB varint cost a
    minute of quadratic work)."""
    byte = buf[pos]
    if byte < 0x80:
        return byte, pos + 1
    result, start = byte & 0x7F, pos
    for shift in range(7, 7 * _VARINT_BYTES, 7):
        pos += 1
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos + 1
    raise ValueError(f"a varint longer than {_VARINT_BYTES} bytes at byte {start} of the record")


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
    # Negative int64 values are 10-byte varints of their two's complement; bits past the
    # 64th (only in a malformed varint) are dropped, as protobuf's parsers drop them.
    values = [v & _U64_MASK for v in values] if any(v >> 64 for v in values) else values
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


def _read_part(unit: SourceUnit) -> tuple[bytes, int, int]:
    """The part's bytes (one read: parts are about PART_BYTES), the file offset of its
    first byte and the number of its first record."""
    first, number, end = unit.span or (0, 0, unit.nbytes)
    with open(unit.path, "rb") as f:
        f.seek(first)
        return f.read(end - first), first, number


def read(unit: SourceUnit) -> Iterator[Record]:
    buf, first, number = _read_part(unit)
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
            raise InputError(f"{where}: {_truncated(length, size - start + 12)}")
        data = buf[start : start + length]
        if _U32.unpack_from(buf, pos - 4)[0] != masked_crc(data):
            raise InputError(f"{where}: bad CRC of the record data (damaged file)")
        try:
            sample = parse_example(data)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise InputError(f"{where}: not a tf.train.Example ({exc})") from exc
        yield label, sample
        number += 1


def read_batches(unit: SourceUnit) -> Iterator[Batch]:
    """The records of :func:`read`, ``BATCH_RECORDS`` at a time: framed and checked with a
    few calls per batch (the CRCs computed in C, compared with numpy), and parsed along the
    first record's layout (:mod:`.tfrecord_layout`) with views of the file's bytes, or one
    by one where a record has another layout. Errors are :func:`read`'s, for the same
    record: a batch's good records come first, then the error of the first bad one."""
    buf, first, number = _read_part(unit)
    frames = _Frames(buf, unit.path, first)
    layout: tuple[Feature, ...] | None = None
    while frames.pos < len(buf):
        starts, ends, error = frames.next_batch(number, BATCH_RECORDS)
        if starts:
            where = functools.partial(_nth_label, unit.path, number)
            columns = parse_batch(buf, starts, ends, layout) if layout else None
            if columns is None and (layout := layout_of(buf, starts[0], ends[0])):
                columns = parse_batch(buf, starts, ends, layout)
            if columns is not None:
                yield Batch(len(starts), where, columns)
            else:
                yield columnize(list(_parse_each(buf, starts, ends, where, frames.where)))
            number += len(starts)
        if error is not None:
            raise error


def _nth_label(path: str, number: int, i: int) -> str:
    return f"{path} record {number + i}"


def _parse_each(
    buf: bytes, starts: list[int], ends: list[int], label: Any, where: Any
) -> Iterator[Record]:
    for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
        try:
            sample = parse_example(buf[start:end])
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise InputError(
                f"{where(label(i), start - 12)}: not a tf.train.Example ({exc})"
            ) from exc
        yield label(i), sample


class _Frames:
    """The records of a part, found and checked a batch at a time."""

    def __init__(self, buf: bytes, path: str, first: int) -> None:
        self.buf, self.path, self.first = buf, path, first
        self.data = np.frombuffer(buf, np.uint8)
        self.pos = 0  # the next record's header

    def where(self, label: str, pos: int) -> str:
        return f"{label} (byte {self.first + pos})"

    def next_batch(self, number: int, limit: int) -> tuple[list[int], list[int], InputError | None]:
        """Up to ``limit`` records from :attr:`pos` (the first numbered ``number``): the
        data spans ``[starts[i], ends[i])`` of those whose framing and CRCs are good, and
        the error of the record after them, if it is bad."""
        buf, size, pos = self.buf, len(self.buf), self.pos
        heads: list[int] = []
        lengths: list[int] = []
        short = False  # the batch ends with a truncated header
        while pos < size and len(heads) < limit:
            if size - pos < 12:
                short = True
                break
            length = _HEAD.unpack_from(buf, pos)[0]
            heads.append(pos)
            if length > size - pos - 16:
                # Past the part's end: the last record of the batch, which ends it with an
                # error. Its length is clipped, so the numpy arithmetic below stays in int64
                # (a header of 2**64 - 1 bytes was an OverflowError, one of 2**63 - 8 wrapped
                # around to an IndexError); _error quotes the header's own number.
                lengths.append(size)
                break
            lengths.append(length)
            pos += length + 16
        head = np.array(heads, np.int64)
        length_ok = _stored(self.data, head + 8) == _masked(
            map(buf.__getitem__, map(slice, heads, (head + 8).tolist()))
        )
        stop = head + np.array(lengths, np.int64) + 16  # past each record's data CRC
        bad = ~length_ok | (stop > size)
        framed = int(np.argmax(bad)) if bad.any() else len(heads)
        starts, ends = (head[:framed] + 12).tolist(), (stop[:framed] - 4).tolist()
        data_ok = _stored(self.data, stop[:framed] - 4) == _masked(
            map(buf.__getitem__, map(slice, starts, ends))
        )
        good = int(np.argmin(data_ok)) if not data_ok.all() else framed
        self.pos, error = pos, None  # (after an error nothing more is read)
        if good < framed:
            error = self._error(number + good, heads[good], "bad CRC of the record data")
        elif framed < len(heads):
            at = heads[framed]
            error = self._error(
                number + framed,
                at,
                "bad CRC of the record length"
                if not length_ok[framed]
                else _truncated(_HEAD.unpack_from(buf, at)[0], size - at),
            )
        elif short:
            error = self._error(number + len(heads), pos, "truncated record header")
        return starts[:good], ends[:good], error

    def _error(self, number: int, at: int, what: str) -> InputError:
        where = self.where(f"{self.path} record {number}", at)
        if what.startswith("bad CRC"):
            what += " (damaged file)"
        return InputError(f"{where}: {what}")


def _truncated(length: int, left: int) -> str:
    """Why a record whose header says ``length`` runs past the end (``left`` bytes from
    its header to the end of the file or part)."""
    return (
        f"truncated record ({length} bytes announced, the file holds {max(left - 16, 0)} "
        "more after the record's header and checksums)"
    )


def _stored(data: np.ndarray[Any, Any], at: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The little-endian uint32 at each position ``at`` of ``data``."""
    words: np.ndarray[Any, Any] = data[at[:, None] + np.arange(4)].copy().view("<u4")[:, 0]
    return words


def _masked(pieces: Iterator[bytes]) -> np.ndarray[Any, Any]:
    """TFRecord's masked CRC32C of each piece (:func:`masked_crc`, in bulk)."""
    crc = np.fromiter(map(google_crc32c.value, pieces), np.uint32)
    return ((crc >> 15) | (crc << 17)) + np.uint32(_MASK_DELTA)


FORMAT = ImportFormat("tfrecord", plan, read, split=split, read_batches=read_batches)
