"""Samples covering every MDS encoding, and helpers to compare decoded values."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

ALL_COLUMNS: dict[str, str] = {
    "arr_fixed": "ndarray:uint16:4,3",
    "arr_dyn": "ndarray",
    "arr_dtype": "ndarray:float32",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "raw": "bytes",
    "text": "str",
    "num": "int",
    "meta": "json",
    "jpg": "jpeg",
    "pic": "png",
    "si": "str_int",
    "sf": "str_float",
    "sd": "str_decimal",
}

FIXED_COLUMNS: dict[str, str] = {
    "tokens": "ndarray:uint16:32",
    "mask": "ndarray:uint8:2,4",
    "id": "int",
    "score": "float32",
    "label": "int16",
}

DYN_DTYPES = [
    "uint8",
    "int8",
    "uint16",
    "int16",
    "float16",
    "uint32",
    "int32",
    "float32",
    "uint64",
    "int64",
    "float64",
]


def image_bytes(fmt: str, seed: int) -> bytes:
    """A small deterministic image encoded as JPEG or PNG."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (6 + seed % 5, 7, 3), dtype=np.uint8)
    out = BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def make_sample(i: int) -> dict[str, Any]:
    """Sample ``i`` for ALL_COLUMNS: every dtype, shape-dtype size and odd value shows up."""
    rng = np.random.default_rng(i)
    dyn_dtype = DYN_DTYPES[i % len(DYN_DTYPES)]
    # Shapes whose largest dimension needs a uint8, uint16 and uint32 shape header.
    dyn_shape = [(2, 3), (300,), (1, 2, 3, 4)][i % 3] if i != 5 else (1, 70000)
    return {
        "arr_fixed": rng.integers(0, 1 << 16, (4, 3)).astype(np.uint16),
        "arr_dyn": (rng.random(dyn_shape) * 100).astype(dyn_dtype),
        "arr_dtype": rng.random((i % 4 + 1,)).astype(np.float32),
        "u8": i % 256,
        "u16": 65535 - i,
        "u32": 2**32 - 1 - i,
        "u64": 2**64 - 1 - i,
        "i8": -128 + i,
        "i16": -(i * 7),
        "i32": -(2**31) + i,
        "i64": -(2**63) + i,
        "f16": np.float16(i / 7),
        "f32": np.float32(-i / 3),
        "f64": i * 1.0e300 if i % 2 else -0.5,
        "raw": bytes(rng.integers(0, 256, i % 9, dtype=np.uint8)),
        "text": "" if i == 0 else "héllo wörld ✓ " * (i % 4),
        "num": (-1) ** i * (2**62 + i),
        "meta": {"i": i, "tags": ["a", "b"][: i % 3], "nested": {"x": None, "y": 1.5}},
        "jpg": image_bytes("JPEG", i),
        "pic": image_bytes("PNG", i),
        "si": 10**30 + i,
        "sf": i / 9,
        "sd": Decimal("1.10") * i,
    }


def make_fixed(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Column arrays for FIXED_COLUMNS with ``n`` samples."""
    rng = np.random.default_rng(seed)
    return {
        "tokens": rng.integers(0, 1 << 16, (n, 32)).astype(np.uint16),
        "mask": rng.integers(0, 2, (n, 2, 4)).astype(np.uint8),
        "id": np.arange(n, dtype=np.int64) * 1000 - 7,
        "score": rng.random(n).astype(np.float32),
        "label": rng.integers(-100, 100, n).astype(np.int16),
    }


def fixed_samples(arrays: dict[str, np.ndarray]) -> Iterator[dict[str, Any]]:
    """One dict per row of column arrays (``int`` column as a Python int)."""
    n = len(next(iter(arrays.values())))
    for i in range(n):
        yield {k: (int(v[i]) if k == "id" else v[i]) for k, v in arrays.items()}


def assert_value_equal(column: str, got: Any, want: Any) -> None:
    """Equal values; images (PIL from MosaicML, bytes from us) compare by pixels."""
    if isinstance(got, Image.Image):
        expected = Image.open(BytesIO(want)) if isinstance(want, bytes) else want
        assert np.array_equal(np.asarray(got), np.asarray(expected)), column
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), column
        assert got.dtype == want.dtype and got.shape == want.shape, column
        assert np.array_equal(got, want), column
    elif isinstance(want, bytes):
        assert bytes(got) == want, column
    else:
        assert got == want, (column, got, want)
        assert type(got) is type(want) or isinstance(got, np.generic), (column, type(got))


def assert_sample_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Same keys, every value equal."""
    assert set(got) == set(want)
    for column, value in want.items():
        assert_value_equal(column, got[column], value)


@pytest.fixture(autouse=True)
def _clean_streaming_shm() -> Iterator[None]:
    """MosaicML keeps per-dataset state in /dev/shm; drop stale entries around each test."""
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    yield
    clean_stale_shared_memory()


@pytest.fixture
def samples() -> list[dict[str, Any]]:
    """30 samples over ALL_COLUMNS."""
    return [make_sample(i) for i in range(30)]


def shard_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by name."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}
