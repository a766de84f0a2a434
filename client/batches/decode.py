"""Turn column values into what a training loop wants: batches as tensors (images are
decoded by :mod:`image_decode`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["IMAGE_ENCODINGS", "stack_or_list", "to_torch"]

IMAGE_ENCODINGS = frozenset({"jpeg", "png", "jpg"})
"""Encodings stored as compressed image bytes and decoded on the client."""


def stack_or_list(values: Sequence[Any]) -> Any:
    """Stack equal-shaped arrays (or tensors) into one ``(n, ...)`` array (tensor);
    anything else stays a list."""
    if values:
        first = values[0]
        kind = np.ndarray if isinstance(first, np.ndarray) else torch.Tensor
        if all(
            isinstance(v, kind) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return np.stack(values) if kind is np.ndarray else torch.stack(list(values))
    return list(values)


def to_torch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Numpy arrays (and lists of them) to tensors; strings, bytes and objects unchanged.

    ``torch.from_numpy`` shares memory, so a batch array becomes a tensor without a copy.
    """
    out: dict[str, Any] = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray) and value.dtype != object:
            out[name] = _tensor(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            out[name] = [_tensor(v) for v in value]
        else:
            out[name] = value
    return out


def _tensor(array: np.ndarray[Any, Any]) -> torch.Tensor:
    """The tensor of ``array``, sharing its memory where it is writable and contiguous.

    A read-only array (a variable-length value is a view of the shard's read-only memory
    map) is copied: a tensor over it would fault on the first in-place write, and torch
    warns about it. (A copy-on-write mapping would spare the copy, but a write would then
    change what later reads of the sample in this process see.) Batch arrays (fixed-size
    columns, stacked values) are writable: no copy.
    """
    if not array.flags.writeable:
        return torch.from_numpy(np.array(array, order="C"))
    return torch.from_numpy(np.ascontiguousarray(array))
