"""Turn column values into what a training loop wants: images as arrays, batches as tensors."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from shardstream.errors import CorruptShardError

__all__ = ["IMAGE_ENCODINGS", "decode_image", "stack_or_list", "to_torch"]

IMAGE_ENCODINGS = frozenset({"jpeg", "png", "jpg"})
"""Encodings stored as compressed image bytes and decoded on the client."""


def decode_image(data: bytes, *, what: str) -> np.ndarray[Any, Any]:
    """Decode JPEG/PNG bytes with Pillow into a ``uint8`` array ``(H, W[, C])``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.asarray(img)
    except (UnidentifiedImageError, OSError) as exc:
        raise CorruptShardError(f"{what}: cannot decode image ({exc})") from exc


def stack_or_list(values: Sequence[Any]) -> Any:
    """Stack equal-shaped arrays into one ``(n, ...)`` array; anything else stays a list."""
    if values and all(isinstance(v, np.ndarray) for v in values):
        first = values[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
    return list(values)


def to_torch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Numpy arrays (and lists of them) to tensors; strings, bytes and objects unchanged.

    ``torch.from_numpy`` shares memory, so a batch array becomes a tensor without a copy.
    """
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            out[name] = torch.from_numpy(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            out[name] = [torch.from_numpy(np.ascontiguousarray(v)) for v in value]
        else:
            out[name] = value
    return out
