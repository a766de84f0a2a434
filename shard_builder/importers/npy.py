"""``.npy`` values (a WebDataset member, an LMDB value) -> numpy arrays, within their bytes.

``np.load`` on a file object that is not a real file allocates the array its header
declares before reading a byte of data: a 200-byte member declaring a shape of 72.8 TiB
was an ``ArrayMemoryError`` traceback (and a smaller lie a big allocation). Here the header
is parsed with numpy's own (bounded, literal-only) parser, and the size it declares is
checked against the bytes that follow it before anything is allocated; the array is then
a copy of exactly those bytes.
"""

from __future__ import annotations

import io
import math
import tokenize
from typing import Any

import numpy as np
from numpy.lib import format as _npy_format

npy_format: Any = _npy_format  # untyped in numpy's stubs
MAX_DIMS = 64  # numpy's own limit on an array's dimensions


def load_npy(data: bytes | memoryview) -> np.ndarray[Any, Any]:
    """The array of the ``.npy`` bytes ``data`` (no pickled objects).

    Any damage is a :class:`ValueError` whose one-line message says what is wrong (the
    caller adds which file and member): a bad header, object arrays, or a shape and dtype
    that need more bytes than ``data`` holds after its header.
    """
    stream = io.BytesIO(data)
    version = npy_format.read_magic(stream)
    try:
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:  # 3.0 (UTF-8 field names) has no public reader; unknown versions fail in it
            shape, fortran, dtype = npy_format._read_array_header(stream, version)
    except (tokenize.TokenError, SyntaxError) as exc:  # numpy lets its tokenizer's out
        raise ValueError(f"a damaged .npy header ({exc})") from exc
    if dtype.hasobject:
        raise ValueError("an object array (it would need pickle, which is not allowed)")
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise ValueError(f"the header declares an invalid shape {shape}")
    count = math.prod(shape)
    if count and not dtype.itemsize:
        raise ValueError(f"the header declares items of zero bytes ({dtype}) in shape {shape}")
    start = stream.tell()
    needed, held = count * dtype.itemsize, len(data) - start
    if needed > held:
        raise ValueError(
            f"the header declares shape {shape} of {dtype} ({needed:,} bytes), but only "
            f"{held:,} bytes follow it"
        )
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=start).copy()
    return flat.reshape(shape, order="F" if fortran else "C")
