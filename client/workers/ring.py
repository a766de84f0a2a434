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
import sys
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

__all__ = ["ArrayRef", "BatchRing", "SlotAllocator", "SlotLoans"]

_ALIGN = 64  # cache-line alignment keeps every column's start aligned for any dtype
_LINUX = sys.platform.startswith("linux")
_MAP_NORESERVE = 0x4000  # <sys/mman.h> on Linux; the mmap module does not export it


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


ArrayRef = tuple[int, str, tuple[int, ...]]
"""Where one batch column lies in a slot: (byte offset, torch dtype name, shape)."""

_NUMPY_OF = {
    name: np.dtype(name)
    for name in (
        *("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"),
        *("float16", "float32", "float64", "bool"),
    )
}


class BatchRing:
    """``slots`` buffers of ``slot_bytes`` each, in one anonymous shared mapping."""

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = _aligned(max(slot_bytes, _ALIGN))
        # MAP_SHARED | MAP_ANONYMOUS, and on Linux MAP_NORESERVE: room reserved for the
        # largest batch costs nothing until a batch writes it.
        flags = mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | (_MAP_NORESERVE if _LINUX else 0)
        self._mem = mmap.mmap(-1, self.slots * self.slot_bytes, flags=flags)
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
        return start, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)

    def tensor(self, slot: int, ref: ArrayRef, *, copy: bool) -> torch.Tensor:
        """A tensor of ``ref`` in ``slot``: a view of the ring, or (``copy``) its own copy.

        The copy is a plain single-threaded memcpy through numpy: torch's ``clone`` may
        fan a 128 KiB copy out to its intra-op thread pool, which costs milliseconds when
        the trainer keeps the cores busy.
        """
        offset, dtype_name, shape = ref
        offset += slot * self.slot_bytes
        np_dtype = _NUMPY_OF.get(dtype_name)
        if np_dtype is not None:  # the common case: one numpy view (and copy), one tensor
            count = 1
            for dim in shape:
                count *= dim
            view = self._base[offset : offset + count * np_dtype.itemsize].view(np_dtype)
            return torch.from_numpy(view.copy() if copy else view).view(shape)
        dtype = getattr(torch, dtype_name)  # bfloat16 and friends: reinterpret bytes
        count = int(np.prod(shape, dtype=np.int64))
        raw = self._base[offset : offset + count * torch.empty((), dtype=dtype).element_size()]
        return torch.from_numpy(raw.copy() if copy else raw).view(dtype).view(shape)

    def slot_tensor(self, slot: int) -> tuple[torch.Tensor, np.ndarray[Any, Any]]:
        """A ``uint8`` tensor over ``slot`` and the array its storage owns (that array is
        freed only once no tensor viewing the slot is left)."""
        owner = self.slot_view(slot)
        return torch.from_numpy(owner), owner


def view_in(slot: torch.Tensor, ref: ArrayRef) -> torch.Tensor:
    """The column ``ref`` as a view of ``slot`` (from :meth:`BatchRing.slot_tensor`)."""
    offset, dtype_name, shape = ref
    dtype = getattr(torch, dtype_name)
    count = 1
    for dim in shape:
        count *= dim
    nbytes = count * dtype.itemsize
    return slot[offset : offset + nbytes].view(dtype).view(shape)


class SlotLoans:
    """The slots of one ring whose batches the training loop holds as views.

    Handing a batch out as a view of its slot costs nothing, where a copy costs a memcpy
    of the batch plus a page fault per 4 KiB of fresh memory in the main process (15-30
    us per 224 x 224 image measured on 2 cores, more than everything else the main
    process does). A lent slot goes back to its worker once the last tensor viewing it is
    garbage collected: a finalizer queues it on ``returned``, which the main process
    drains (a finalizer may run on any thread; sends stay on the main one). At most
    ``limit`` slots are out at a time, so a training loop that keeps its batches (a list
    of them, say) gets copies past that instead of stalling the worker.
    """

    def __init__(self, ring: BatchRing, limit: int, returned: deque[tuple[Any, int]]) -> None:
        self.ring = ring
        self.limit = limit
        self.out: set[int] = set()
        self._returned = returned

    def can_lend(self) -> bool:
        """Whether one more slot may go out as views."""
        return len(self.out) < self.limit

    def lend(self, slot: int) -> torch.Tensor:
        """A ``uint8`` tensor over ``slot``; views of it keep the slot out."""
        tensor, owner = self.ring.slot_tensor(slot)
        self.out.add(slot)
        weakref.finalize(owner, self._returned.append, (self, slot))
        return tensor

    def back(self, slot: int) -> None:
        """``slot`` came back (its finalizer ran)."""
        self.out.discard(slot)


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
