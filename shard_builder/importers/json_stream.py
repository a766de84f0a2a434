"""A JSON object whose one big array is handed over element by element, never held whole.

A LitData ``index.json`` of a million chunks is 86 MB of text, and ``json.loads`` turns it
into a million dicts at once (half a gigabyte) only for the importer to copy four fields
out of each. Here the object is parsed with the standard library's own scanner, one value
at a time (:meth:`json.JSONDecoder.raw_decode`), and the elements of the named array go to
a callback a few thousand at a time, as they are parsed: the memory is the text and what
the callback keeps.
Damage is a :class:`ValueError` (``json.JSONDecodeError`` where the scanner finds it) with
the character position, as ``json.loads`` reports it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODE = json.JSONDecoder().raw_decode
BATCH_ITEMS = 1 << 10  # elements handed over at once (and between two calls of ``tick``)


def load_streaming(
    text: str,
    key: str,
    take: Callable[[list[Any]], None],
    tick: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """The JSON object ``text`` without its array ``key``, whose elements went to ``take``
    in order, in lists of up to :data:`BATCH_ITEMS` (the key then maps to ``None``);
    ``tick(chars)`` is told how far the parse got after each list (for a progress bar).

    Anything but an object, with ``key`` (if present) an array and given once, is a
    :class:`ValueError`.
    """
    pos = _skip(text, 0)
    _expect(text, pos, "{")
    out: dict[str, Any] = {}
    pos = _skip(text, pos + 1)
    if text.startswith("}", pos):
        return _end(text, pos + 1, out)
    while True:
        if not text.startswith('"', pos):
            _fail(text, pos, "a property name in double quotes")
        name, pos = _DECODE(text, pos)
        pos = _skip(text, pos)
        _expect(text, pos, ":")
        pos = _skip(text, pos + 1)
        if name == key:
            if name in out:
                raise ValueError(f"{key!r} appears twice (char {pos})")
            pos = _array(text, pos, take, tick)
            value = None
        else:
            value, pos = _DECODE(text, pos)
        out[name] = value
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
            continue
        _expect(text, pos, "}")
        return _end(text, pos + 1, out)


def _array(
    text: str, pos: int, take: Callable[[list[Any]], None], tick: Callable[[int], object] | None
) -> int:
    """Parse the array at ``pos``, handing its elements to ``take`` a list of up to
    :data:`BATCH_ITEMS` at a time; the position after it."""
    _expect(text, pos, "[")
    pos = _skip(text, pos + 1)
    if text.startswith("]", pos):
        return pos + 1
    batch: list[Any] = []
    while True:
        item, pos = _DECODE(text, pos)
        batch.append(item)
        if len(batch) == BATCH_ITEMS:
            take(batch)
            batch = []
            if tick is not None:
                tick(pos)
        pos = _skip(text, pos)
        if text.startswith(",", pos):
            pos = _skip(text, pos + 1)
            continue
        _expect(text, pos, "]")
        take(batch)
        return pos + 1


def _skip(text: str, pos: int) -> int:
    """The position of the first character at or after ``pos`` that is not JSON space."""
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def _end(text: str, pos: int, out: dict[str, Any]) -> dict[str, Any]:
    if _skip(text, pos) != len(text):
        _fail(text, pos, "the end of the text")
    return out


def _expect(text: str, pos: int, char: str) -> None:
    if not text.startswith(char, pos):
        _fail(text, pos, repr(char))


def _fail(text: str, pos: int, wanted: str) -> None:
    raise json.JSONDecodeError(f"Expecting {wanted}", text, pos)
