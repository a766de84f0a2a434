"""Python values -> MDS columns, for formats whose records hold Python objects (LitData
items, unpickled LMDB values)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from shardstream.errors import InputError
from shardstream.shard_builder.importers.source import Column

# The exact types most values have: one dict lookup instead of a chain of isinstance calls
# (this runs once per column of every record).
PLAIN_TYPES: dict[type, str] = {int: "int", float: "float64", str: "str", bytes: "bytes"}


def column_of(value: Any, where: str, what: str = "value") -> Column:
    """The MDS encoding and value of ``value``: ``int``, ``float64``, ``str``, ``bytes``,
    ``ndarray`` (numpy arrays, torch tensors) or ``json`` (lists, dicts, ``None``); any
    other type is one :class:`InputError` naming ``where`` (``what`` says what it is)."""
    plain = PLAIN_TYPES.get(type(value))
    if plain is not None:
        return plain, value
    if isinstance(value, bool | int | np.integer):
        return "int", int(value)
    if isinstance(value, float | np.floating):
        return "float64", float(value)
    if isinstance(value, str):
        return "str", value
    if isinstance(value, bytes | bytearray | memoryview):
        return "bytes", bytes(value)
    if isinstance(value, np.ndarray):
        return "ndarray", value
    if hasattr(value, "numpy"):  # a torch tensor
        return "ndarray", np.asarray(value.numpy())
    if value is None or isinstance(value, list | dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise InputError(f"{where}: the {what} is not JSON-like ({exc})") from exc
        return "json", value
    raise InputError(
        f"{where}: the {what} is a {type(value).__module__}.{type(value).__name__}; an MDS "
        "column holds int, float, str, bytes, arrays or JSON-like values"
    )


def columns_of(item: dict[Any, Any], where: str) -> dict[str, Column]:
    """One column per key of ``item`` (see :func:`column_of`); an error names the key."""
    out: dict[str, Column] = {}
    for key, value in item.items():
        plain = PLAIN_TYPES.get(type(value))
        out[str(key)] = (plain, value) if plain else column_of(value, f"{where} key {key!r}")
    return out
