"""A ring of preallocated batch buffers in anonymous shared memory, one ring per worker.

The fast loader's workers gather each batch straight into a free *slot* of their ring
and hand the main process only ``(slot, layout)``: a few dozen bytes through a pipe,
instead of torch's per-batch shared-memory file, file-descriptor passing and unpickling.

The memory is an anonymous ``MAP_SHARED`` mapping created in the parent before the
worker is forked, so it has no name anywhere: no ``/dev/shm`` segment exists that a
SIGKILLed process could leak. The kernel frees it when the last process mapping it exits.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["ArrayRef", "BatchRing", "SlotAllocator"]

_ALIGN = 64  # cache-line alignment keeps every column's start aligned for any dtype


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class ArrayRef:
    """Where one batch column lies in a slot: byte offset, torch dtype name, shape."""

    offset: int
    dtype: str
    shape: tuple[int, ...]


class BatchRing:
    """``slots`` buffers of ``slot_bytes`` each, in one anonymous shared mapping."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = _aligned(max(slot_bytes, _ALIGN))
        self._mem = mmap.mmap(-1, self.slots * self.slot_bytes)  # MAP_SHARED | MAP_ANONYMOUS
        self._base = np.frombuffer(self._mem, np.uint8)
        self._addr = self._base.ctypes.data

    def slot_view(self, slot: int) -> np.ndarray[Any, Any]:
        """The raw bytes of ``slot``."""
        start = slot * self.slot_bytes
        return self._base[start : start + self.slot_bytes]

    def locate(self, tensor: torch.Tensor, slot: int) -> ArrayRef | None:
        """The reference of ``tensor`` if it lies (contiguous) inside ``slot``, else None."""
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            return None
        start = tensor.data_ptr() - self._addr - slot * self.slot_bytes
        end = start + tensor.numel() * tensor.element_size()
        if start < 0 or end > self.slot_bytes:
            return None
        return ArrayRef(start, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))

    def tensor(self, slot: int, ref: ArrayRef) -> torch.Tensor:
        """A tensor viewing ``ref`` in ``slot`` (shares memory with the ring)."""
        dtype = getattr(torch, ref.dtype)
        count = int(np.prod(ref.shape, dtype=np.int64))
        offset = slot * self.slot_bytes + ref.offset
        if count == 0:
            return torch.empty(ref.shape, dtype=dtype)
        flat = torch.frombuffer(self._mem, dtype=dtype, count=count, offset=offset)
        return flat.view(ref.shape)


class SlotAllocator:
    """Hands out arrays inside one slot, bump-pointer style; falls back to private memory
    when a batch does not fit (e.g. variable-size values), which then travels pickled."""

    def __init__(self, ring: BatchRing) -> None:
        self._ring = ring
        self._slot = 0
        self._used = 0

    def reset(self, slot: int) -> None:
        """Start filling ``slot`` from its beginning."""
        self._slot, self._used = slot, 0

    def __call__(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> np.ndarray[Any, Any]:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._used + nbytes > self._ring.slot_bytes:
            return np.empty(shape, dtype)
        raw = self._ring.slot_view(self._slot)[self._used : self._used + nbytes]
        self._used = _aligned(self._used + nbytes)
        return raw.view(dtype).reshape(shape)
