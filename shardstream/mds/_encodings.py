"""Column encodings: value <-> bytes, byte-identical to mosaicml-streaming 0.13.

Each encoding string of an MDS column (``"str"``, ``"uint16"``, ``"ndarray:uint16:2048"``)
is parsed once into a :class:`Codec`, which holds two plain functions so that the
per-sample path costs one call per column and nothing more.

As in MosaicML, a ``bytes`` value given for any column is taken as already encoded and
stored as is (fixed-size columns still check its length). Encode errors raise
:class:`InputError` without the column name; the caller adds it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from io import BytesIO
from typing import Any

import numpy as np

from shardstream.errors import InputError, UnsupportedEncodingError

Buffer = bytes | memoryview

# Value dtypes and their one-byte codes in MosaicML's dynamic NDArray header.
_DTYPE_CODES: dict[str, int] = {
    "uint8": 8,
    "int8": 9,
    "uint16": 16,
    "int16": 17,
    "float16": 18,
    "uint32": 32,
    "int32": 33,
    "float32": 34,
    "uint64": 64,
    "int64": 65,
    "float64": 66,
}
_CODE_DTYPES = {code: np.dtype(name) for name, code in _DTYPE_CODES.items()}
# Keyed by dtype: ``dtype.name`` costs microseconds per array, too much per sample.
_DTYPE_CODE_OF = {dtype: code for code, dtype in _CODE_DTYPES.items()}
# Shape dtype codes (the low two bits of the ndim byte).
_SHAPE_DTYPES = (np.dtype("uint8"), np.dtype("uint16"), np.dtype("uint32"), np.dtype("uint64"))

_MAX_SAMPLE = 1 << 32  # shards use uint32 offsets: no value can be larger

SCALAR_ENCODINGS: tuple[str, ...] = tuple(_DTYPE_CODES)
"""Encodings that store one fixed-size numpy scalar (read back as a numpy scalar)."""

ENCODINGS: tuple[str, ...] = (
    "bytes",
    "float16",
    "float32",
    "float64",
    "int",
    "int16",
    "int32",
    "int64",
    "int8",
    "jpeg",
    "json",
    "ndarray",
    "png",
    "str",
    "str_decimal",
    "str_float",
    "str_int",
    "uint16",
    "uint32",
    "uint64",
    "uint8",
)
"""Encoding names shardstream reads and writes. ``ndarray`` also takes ``:dtype`` and
``:dtype:d0,d1,...`` suffixes (fixed dtype, fixed shape)."""


@dataclass(frozen=True)
class Codec:
    """How one column encoding maps values to bytes and back.

    ``size`` is the fixed encoded size in bytes, or ``None`` for variable-size encodings.
    Fixed-size encodings are all numeric: ``dtype`` and ``shape`` describe one sample's
    value (shape ``()`` for scalars), which is what makes vectorized gathers possible.
    """

    encoding: str
    size: int | None
    encode: Callable[[Any], bytes]
    decode: Callable[[Buffer], Any]
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] | None = None


def _type_error(expected: str, value: Any) -> InputError:
    return InputError(f"expected {expected}, got {type(value).__name__}")


def _bytes_codec(encoding: str) -> Codec:
    def encode(value: Any) -> bytes:
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        if encoding in ("jpeg", "png") and _is_pil_image(value):
            return _encode_pil(encoding, value)
        raise _type_error("bytes" if encoding == "bytes" else "bytes or a PIL image", value)

    return Codec(encoding, None, encode, bytes)


def _is_pil_image(value: Any) -> bool:
    module = type(value).__module__
    if not module.startswith("PIL."):
        return False
    from PIL import Image

    return isinstance(value, Image.Image)


def _encode_pil(encoding: str, image: Any) -> bytes:
    """Encode a PIL image exactly as MosaicML's JPEG/PNG encodings do."""
    from PIL.JpegImagePlugin import JpegImageFile

    # MosaicML stores an opened JPEG file's original bytes rather than re-encoding it.
    if encoding == "jpeg" and isinstance(image, JpegImageFile) and image.filename:
        try:
            with open(image.filename, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            pass
    out = BytesIO()
    try:
        image.save(out, format="JPEG" if encoding == "jpeg" else "PNG")
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot encode the image as {encoding}: {exc}") from exc
    return out.getvalue()


def _str_codec() -> Codec:
    def encode(value: Any) -> bytes:
        if isinstance(value, str):
            try:
                return value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InputError(f"string is not valid UTF-8: {exc}") from None
        raise _type_error("str", value)

    return Codec("str", None, encode, lambda buf: str(buf, "utf-8"))


def _int_codec() -> Codec:
    def encode(value: Any) -> bytes:
        if not isinstance(value, int | np.integer):
            raise _type_error("int", value)
        try:
            return int(value).to_bytes(8, "little", signed=True)
        except OverflowError:
            raise InputError(f"{value} does not fit in int64") from None

    def decode(buf: Buffer) -> int:
        return int.from_bytes(buf, "little", signed=True)

    return Codec("int", 8, encode, decode, np.dtype("<i8"), ())


def _scalar_codec(name: str) -> Codec:
    dtype = np.dtype(name)
    make = dtype.type

    def encode(value: Any) -> bytes:
        try:
            return bytes(make(value).tobytes())
        except (OverflowError, TypeError, ValueError) as exc:
            raise InputError(f"{value!r} is not a valid {name}: {exc}") from None

    def decode(buf: Buffer) -> Any:
        return np.frombuffer(buf, dtype, 1)[0]

    return Codec(name, dtype.itemsize, encode, decode, dtype, ())


def _json_codec() -> Codec:
    def encode(value: Any) -> bytes:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        try:
            return json.dumps(value).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InputError(f"value is not JSON-serializable: {exc}") from None

    return Codec("json", None, encode, lambda buf: json.loads(bytes(buf)))


def _str_number_codec(encoding: str) -> Codec:
    kinds: dict[str, tuple[type, Callable[[str], Any]]] = {
        "str_int": (int, int),
        "str_float": (float, float),
        "str_decimal": (Decimal, Decimal),
    }
    kind, parse = kinds[encoding]

    def encode(value: Any) -> bytes:
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _type_error(kind.__name__, value)
        return str(value).encode("utf-8")

    def decode(buf: Buffer) -> Any:
        try:
            return parse(str(buf, "utf-8"))
        except (ValueError, InvalidOperation) as exc:
            raise ValueError(f"not a {encoding} value: {exc}") from None

    return Codec(encoding, None, encode, decode)


def _ndarray_codec(
    encoding: str, dtype: np.dtype[Any] | None, shape: tuple[int, ...] | None
) -> Codec:
    size = None if dtype is None or shape is None else math.prod(shape) * dtype.itemsize

    def encode(value: Any) -> bytes:
        if not isinstance(value, np.ndarray):
            raise _type_error("numpy.ndarray", value)
        parts: list[bytes] = []
        if dtype is None:
            code = _DTYPE_CODE_OF.get(value.dtype)
            if code is None or not value.dtype.isnative:
                raise InputError(
                    f"unsupported dtype {value.dtype}; use one of {', '.join(_DTYPE_CODES)}"
                )
            parts.append(bytes((code,)))
        elif value.dtype != dtype:
            raise InputError(f"wrong dtype: expected {dtype.name}, got {value.dtype}")
        if value.size == 0:
            raise InputError("cannot encode an array with 0 elements")
        if shape is None:
            parts.append(_shape_header(value.shape))
        elif value.shape != shape:
            raise InputError(f"wrong shape: expected {shape}, got {value.shape}")
        parts.append(value.tobytes())
        return b"".join(parts)

    def decode(buf: Buffer) -> np.ndarray[Any, Any]:
        pos = 0
        vdtype = dtype
        if vdtype is None:
            vdtype = _CODE_DTYPES.get(buf[0])
            if vdtype is None:
                raise ValueError(f"unknown ndarray dtype code {buf[0]}")
            pos = 1
        vshape = shape
        if vshape is None:
            ndim, sdtype = buf[pos] >> 2, _SHAPE_DTYPES[buf[pos] & 3]
            vshape = tuple(int(d) for d in np.frombuffer(buf, sdtype, ndim, pos + 1))
            pos += 1 + ndim * sdtype.itemsize
        count = math.prod(vshape)
        if (len(buf) - pos) != count * vdtype.itemsize:
            raise ValueError(f"ndarray of shape {vshape} does not fill its {len(buf)} bytes")
        return np.frombuffer(buf, vdtype, count, pos).reshape(vshape)

    return Codec(encoding, size, encode, decode, dtype if size else None, shape if size else None)


def _shape_header(shape: tuple[int, ...]) -> bytes:
    if not shape:
        raise InputError("cannot encode a 0-d array as ndarray; use a scalar encoding")
    if len(shape) >= 64:
        raise InputError(f"array has {len(shape)} axes; at most 63 are allowed")
    biggest = max(shape)
    code = 0 if biggest < 1 << 8 else 1 if biggest < 1 << 16 else 2 if biggest < 1 << 32 else 3
    dims = np.array(shape, _SHAPE_DTYPES[code]).tobytes()
    return bytes(((len(shape) << 2) | code,)) + dims


def _parse_ndarray(encoding: str) -> Codec:
    return _ndarray_codec(encoding, *ndarray_spec(encoding))


def ndarray_spec(encoding: str) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
    """The dtype and shape of one value of an ``ndarray[:<dtype>[:<d0,d1,...>]]`` encoding
    (``None`` where the encoding leaves them to each value); :class:`UnsupportedEncodingError`
    for a malformed one or one that is not an ``ndarray``."""
    name, *args = encoding.split(":")
    if name != "ndarray":
        raise UnsupportedEncodingError(f"{encoding!r} is not an ndarray encoding")
    if len(args) > 2 or (args and args[0] not in _DTYPE_CODES):
        raise UnsupportedEncodingError(
            f"bad ndarray encoding {encoding!r}: expected ndarray, ndarray:<dtype> or "
            f"ndarray:<dtype>:<d0,d1,...> with dtype one of {', '.join(_DTYPE_CODES)}"
        )
    dtype = np.dtype(args[0]) if args else None
    shape = None
    if len(args) == 2:
        try:
            shape = tuple(int(d) for d in args[1].split(","))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise UnsupportedEncodingError(
                f"bad ndarray encoding {encoding!r}: the shape must be positive integers "
                "separated by commas"
            )
        if len(shape) >= 64 or math.prod(shape) * np.dtype(args[0]).itemsize >= _MAX_SAMPLE:
            raise UnsupportedEncodingError(
                f"bad ndarray encoding {encoding!r}: one value would not fit in a shard "
                "(at most 63 axes and 4 GiB)"
            )
    return dtype, shape


_SIMPLE: dict[str, Callable[[], Codec]] = {
    "bytes": lambda: _bytes_codec("bytes"),
    "jpeg": lambda: _bytes_codec("jpeg"),
    "png": lambda: _bytes_codec("png"),
    "str": _str_codec,
    "int": _int_codec,
    "json": _json_codec,
    "str_int": lambda: _str_number_codec("str_int"),
    "str_float": lambda: _str_number_codec("str_float"),
    "str_decimal": lambda: _str_number_codec("str_decimal"),
}
_CACHE: dict[str, Codec] = {}


def get_codec(encoding: str) -> Codec:
    """The :class:`Codec` of an encoding string; :class:`UnsupportedEncodingError` if unknown."""
    if not isinstance(encoding, str):
        raise UnsupportedEncodingError(f"column encoding must be a string, got {encoding!r}")
    codec = _CACHE.get(encoding)
    if codec is not None:
        return codec
    if encoding in _SIMPLE:
        codec = _SIMPLE[encoding]()
    elif encoding in _DTYPE_CODES:
        codec = _scalar_codec(encoding)
    elif encoding == "ndarray" or encoding.startswith("ndarray:"):
        codec = _parse_ndarray(encoding)
    else:
        hint = " (pickle is refused: it can run arbitrary code)" if encoding == "pkl" else ""
        raise UnsupportedEncodingError(
            f"unsupported column encoding {encoding!r}{hint}; supported: {', '.join(ENCODINGS)}"
        )
    _CACHE[encoding] = codec
    return codec


def encoded_size(encoding: str) -> int | None:
    """Fixed encoded size in bytes of ``encoding``, or ``None`` if it is variable-size."""
    return get_codec(encoding).size
