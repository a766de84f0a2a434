"""Many ``tf.train.Example`` records of one layout, parsed at once with numpy.

The records of a TFRecord file are nearly always written by one loop: the same features,
in the same order, each with the same kind of list. Only the lengths (and so the varints
that hold them) change from record to record. So the byte layout of the first record is
read once (:func:`layout_of`), and then every record of a batch is walked along it in
lock step (:func:`parse_batch`): each step (a tag byte, a length varint, a key) is one
numpy call over all the records, never Python per record. The values come out as columns:
a ``bytes_list`` of one value as views of the file's bytes, an ``int64_list`` and a
``float_list`` as stacked arrays (or one array per record where the lengths differ).

Only the layout that ``tfrecord.parse_example`` would read the plain way is taken: the
Example holding just its ``features``, each map entry holding its key then its value, each
``Feature`` holding one list, packed numeric lists, bytes lists of exactly one value. A
batch where any record differs in any byte of that structure (another feature, another
order, an unknown field, a bytes list of several values, a varint of more than 10 bytes)
returns ``None``, and the caller parses it record by record with the general parser,
which gives the same columns for the records this path takes (tested on random inputs)
and names the record of any error.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

Array = np.ndarray[Any, Any]
Columns = dict[str, tuple[str, Any]]

BYTES, FLOATS, INT64S = 1, 2, 3  # the ``Feature`` field number of each kind of list
_TAG = {BYTES: 0x0A, FLOATS: 0x12, INT64S: 0x1A}
_MAX_LENGTH = 5  # bytes of a length varint taken here (lengths below 2**35)


class Feature(NamedTuple):
    """One feature of a layout: its key (UTF-8) and the kind of its list."""

    key: bytes
    kind: int


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it; ``(0, end + 1)`` (a position
    past ``end``, which every caller refuses) when it does not end before ``end`` or within
    10 bytes (a longer one is no layout: the general parser names it; reading it all here
    was quadratic in its length)."""
    result = shift = 0
    for at in range(pos, min(end, pos + 10)):
        byte = buf[at]
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, at + 1
        shift += 7
    return 0, end + 1


def layout_of(buf: bytes, start: int, end: int) -> tuple[Feature, ...] | None:
    """The features of the Example in ``buf[start:end]`` if it has the plain layout (see
    the module's docstring), with distinct keys; else ``None``."""
    if start >= end or buf[start] != 0x0A:
        return None
    size, pos = _varint(buf, start + 1, end)
    if pos + size != end:
        return None
    features: list[Feature] = []
    while pos < end:
        if buf[pos] != 0x0A:
            return None
        size, pos = _varint(buf, pos + 1, end)
        entry_end = pos + size
        if entry_end > end or pos >= entry_end or buf[pos] != 0x0A:
            return None
        size, pos = _varint(buf, pos + 1, entry_end)
        key = buf[pos : pos + size]
        pos += size
        if pos >= entry_end or buf[pos] != 0x12:
            return None
        size, pos = _varint(buf, pos + 1, entry_end)
        if pos + size != entry_end or pos >= entry_end:
            return None
        kind = buf[pos] >> 3
        if buf[pos] != _TAG.get(kind):
            return None
        features.append(Feature(bytes(key), kind))
        pos = entry_end
    keys = [f.key for f in features]
    if len(set(keys)) != len(keys):
        return None
    try:
        for key in keys:
            key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return tuple(features)


class _Walk:
    """Every record of a batch, walked in lock step: ``pos[i]`` is where record ``i`` is."""

    def __init__(self, data: Array, starts: Array, ends: Array) -> None:
        self.data, self.pos, self.ends = data, starts.copy(), ends
        self.last = len(data) - 1

    def tag(self, value: int) -> bool:
        """Step over one tag byte, ``value`` in every record."""
        if not (self.pos < self.ends).all():
            return False
        ok = bool((self.data[self.pos] == value).all())
        self.pos += 1
        return ok

    def length(self, limit: Array) -> Array | None:
        """Step over a length varint in every record; the lengths, or ``None`` where one
        is longer than ``_MAX_LENGTH`` bytes or does not end before ``limit``."""
        first = self.data[np.minimum(self.pos, self.last)]
        if (first < 0x80).all():  # one byte each: the usual case for small fields
            if not (self.pos < limit).all():
                return None
            self.pos += 1
            ones: Array = first.astype(np.int64)
            return ones
        window = self.data[np.minimum(self.pos[:, None] + np.arange(_MAX_LENGTH), self.last)]
        more = window >= 0x80
        if more.all(axis=1).any():
            return None
        size = np.argmin(more, axis=1) + 1  # bytes of each varint
        if not (self.pos + size <= limit).all():
            return None
        shifts = 7 * np.arange(_MAX_LENGTH, dtype=np.int64)
        keep = np.arange(_MAX_LENGTH) < size[:, None]
        values = ((window.astype(np.int64) & 0x7F) << shifts) * keep
        self.pos += size
        lengths: Array = values.sum(axis=1)
        return lengths

    def key(self, key: bytes) -> bool:
        """Step over ``key``'s bytes, the same in every record."""
        width = len(key)
        if not (self.pos + width <= self.ends).all():
            return False
        if width:
            got = self.data[self.pos[:, None] + np.arange(width)]
            if not (got == np.frombuffer(key, np.uint8)).all():
                return False
        self.pos += width
        return True


def parse_batch(
    buf: bytes, starts: Sequence[int], ends: Sequence[int], layout: tuple[Feature, ...]
) -> Columns | None:
    """The columns of the Examples ``buf[starts[i]:ends[i]]``, every one of ``layout``;
    ``None`` where any record is not (the caller then parses them one by one).

    Columns are ``(encoding, values)`` as :func:`.tfrecord.parse_example` gives them, one
    value per record: ``bytes`` values as ``memoryview`` s of ``buf``, ``ndarray`` values
    stacked on axis 0 where all records have the same length, else as a list.
    """
    data = np.frombuffer(buf, np.uint8)
    end = np.asarray(ends, np.int64)
    walk = _Walk(data, np.asarray(starts, np.int64), end)
    if not walk.tag(0x0A) or (size := walk.length(end)) is None or (walk.pos + size != end).any():
        return None
    view = memoryview(buf)
    columns: Columns = {}
    for feature in layout:
        if not walk.tag(0x0A) or (size := walk.length(end)) is None:
            return None
        entry_end = walk.pos + size
        if not walk.tag(0x0A) or (size := walk.length(entry_end)) is None:
            return None
        if (size != len(feature.key)).any() or not walk.key(feature.key):
            return None
        if not walk.tag(0x12) or (size := walk.length(entry_end)) is None:
            return None
        if (walk.pos + size != entry_end).any() or not walk.tag(_TAG[feature.kind]):
            return None
        if (size := walk.length(entry_end)) is None or (walk.pos + size != entry_end).any():
            return None
        column = _list(walk, view, feature.kind, entry_end)
        if column is None:
            return None
        columns[feature.key.decode("utf-8")] = column
        walk.pos = entry_end
    if (walk.pos != end).any():
        return None
    return columns


def _list(walk: _Walk, view: memoryview, kind: int, end: Array) -> tuple[str, Any] | None:
    """The list that fills ``[walk.pos, end)`` of every record, as a column."""
    empty = walk.pos == end
    if kind == BYTES:  # exactly one value, filling the list
        if empty.any() or not walk.tag(0x0A) or (size := walk.length(end)) is None:
            return None
        if (walk.pos + size != end).any():
            return None
        bounds = map(slice, walk.pos.tolist(), end.tolist())
        return "bytes", list(map(view.__getitem__, bounds))
    if empty.all():  # an empty numeric list in every record
        return "ndarray", np.zeros((len(end), 0), np.int64 if kind == INT64S else np.float32)
    if empty.any() or not walk.tag(0x0A) or (size := walk.length(end)) is None:
        return None
    if (walk.pos + size != end).any():
        return None
    if kind == FLOATS:
        return _floats(walk.data, walk.pos, end)
    return _int64s(walk.data, walk.pos, end)


def _gather(data: Array, starts: Array, ends: Array) -> Array:
    """The bytes ``data[starts[i]:ends[i]]`` of every record, back to back."""
    sizes = ends - starts
    offsets = np.cumsum(sizes) - sizes  # where each record's bytes go
    index = np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(starts - offsets, sizes)
    gathered: Array = data[index]
    return gathered


def _rows(values: Array, counts: Array) -> Any:
    """``values`` cut into records of ``counts`` values: one 2-D array where all counts
    are equal, else a list of arrays."""
    if (counts == counts[0]).all():
        return values.reshape(len(counts), int(counts[0]))
    return np.split(values, np.cumsum(counts)[:-1])


def _floats(data: Array, starts: Array, ends: Array) -> tuple[str, Any] | None:
    sizes = ends - starts
    if (sizes % 4).any() or not sizes.all():
        return None
    values = _gather(data, starts, ends).view("<f4").astype(np.float32)
    return "ndarray", _rows(values, sizes // 4)


def _int64s(data: Array, starts: Array, ends: Array) -> tuple[str, Any] | None:
    """Packed varints; ``None`` for a run that does not end a varint or has a varint of
    more than 10 bytes (bits past the 64th are dropped, as the general parser drops them)."""
    if not (ends > starts).all():
        return None  # an empty packed run: rare, left to the general parser
    raw = _gather(data, starts, ends)
    last = raw < 0x80  # the last byte of each varint
    if not last[np.cumsum(ends - starts) - 1].all():
        return None
    stops = np.flatnonzero(last)
    begins = np.concatenate(([0], stops[:-1] + 1))
    widths = stops - begins + 1
    if (widths > 10).any():
        return None
    which = np.repeat(np.arange(len(stops)), widths)  # the varint of each byte
    shift = (7 * (np.arange(len(raw)) - begins[which])).astype(np.uint64)
    bits = (raw & 0x7F).astype(np.uint64) << shift
    values = np.bitwise_or.reduceat(bits, begins).view(np.int64)
    counts = np.add.reduceat(last, np.cumsum(ends - starts) - (ends - starts)).astype(np.int64)
    return "ndarray", _rows(values, counts)
