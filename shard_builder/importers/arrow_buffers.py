"""Values of Arrow arrays taken from their buffers, without a Python object per value.

Shared by the readers of Arrow data (Hugging Face files, LitData's Arrow chunk footers).
Both take arrays without nulls, and honour an array's offset (a slice of a record batch).
pyarrow's own ``to_numpy`` is not used: it imports pandas, a quarter of a second in every
worker process.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def binary_views(array: Any) -> list[memoryview]:
    """The values of a binary or string array (large or not) as views of its data buffer."""
    import pyarrow as pa

    _, offsets, data = array.buffers()
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    wide = "<i8" if large else "<i4"
    bounds = np.frombuffer(offsets, wide)[array.offset : array.offset + len(array) + 1].tolist()
    view = memoryview(data) if data is not None else memoryview(b"")
    return list(map(view.__getitem__, map(slice, bounds[:-1], bounds[1:])))


def numbers(array: Any) -> np.ndarray[Any, Any]:
    """A bool, int or float array's values (bools as 0 and 1), from its data buffer."""
    import pyarrow as pa

    t, data, lo = array.type, array.buffers()[1], array.offset
    if pa.types.is_boolean(t):
        bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        return bits[lo : lo + len(array)]
    kind = "f" if pa.types.is_floating(t) else "i" if pa.types.is_signed_integer(t) else "u"
    return np.frombuffer(data, f"<{kind}{t.bit_width // 8}")[lo : lo + len(array)]
