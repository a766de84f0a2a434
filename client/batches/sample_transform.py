"""Per-sample transforms in the workers, with augmentations that replay exactly on resume.

A vision pipeline works per sample: decode, then a random crop and flip of each image
(``torchvision.transforms.v2``), then collate. :class:`SampleStage` runs it inside the
process that builds the batch: each sample becomes a dict (images decoded to ``uint8``
``(C, H, W)`` tensors, scalars as Python numbers, fixed-size arrays as tensors), the
user's function maps it to another dict, and the results are collated into one batch
(equal-shaped tensors stacked straight into the batch's shared memory, numbers into
tensors, anything else into lists).

Determinism: before each sample, torch's default generator, Python's ``random`` and
numpy's global generator are seeded from ``(seed, epoch, global batch, sample id)``. The
augmentation of a sample therefore depends on where it sits in the epoch's global order
only: not on the rank, the worker, the world size or what ran before, so a resumed run
(on any number of nodes) draws the same crops as an uninterrupted one. The generators'
states are restored after each batch, so a transform run in the training process leaves
the trainer's random streams as they were.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from shardstream.client.batches.decode import IMAGE_ENCODINGS
from shardstream.client.batches.image_decode import ImageDecoder
from shardstream.errors import ConfigError

__all__ = ["SampleStage", "SampleTransform", "collate", "sample_seed"]

SampleTransform = Callable[[dict[str, Any]], Mapping[str, Any]]
"""A user function applied to every sample (column -> value) before collation."""

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit ints that spreads every input bit."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, batch: int, sample_id: int) -> int:
    """The 63-bit seed of one sample's augmentation (a hash of where it sits)."""
    h = _mix(seed & _MASK)
    for part in (epoch, batch, sample_id):
        h = _mix((h + 0x9E3779B97F4A7C15 + (part & _MASK)) & _MASK)
    return h >> 1


class SampleStage:
    """Turns a built batch (images still bytes) into the collated output of ``transform``."""

    def __init__(
        self,
        transform: SampleTransform,
        *,
        encodings: Mapping[str, str],
        decoder: ImageDecoder,
        seed: int,
    ) -> None:
        self.transform = transform
        self.images = frozenset(n for n, e in encodings.items() if e in IMAGE_ENCODINGS)
        self.decoder = ImageDecoder(decoder.name, "CHW", decoder.mode, decoder.min_size)
        self.seed = seed
        self.hand_over_images = False
        """Set by a loader with a device stage: images leave as bytes and boxes
        (``transform.hand_over``: :class:`~shardstream.client.RandomResizedCropFlip`)."""

    def apply(
        self,
        batch: Mapping[str, Any],
        *,
        epoch: int,
        batch_number: int,
        ids: Sequence[int],
        alloc: Callable[[str, tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]],
    ) -> dict[str, Any]:
        """Transform every sample of ``batch`` (``ids``: their global ids) and collate."""
        if self.hand_over_images:
            seeds = [sample_seed(self.seed, epoch, batch_number, int(sid)) for sid in ids]
            out: dict[str, Any] = self.transform.hand_over(  # type: ignore[attr-defined]
                batch, seeds=seeds, alloc=alloc
            )
            return out
        saved = (torch.random.get_rng_state(), random.getstate(), np.random.get_state())
        try:
            outputs = [
                self._one(batch, i, epoch, batch_number, int(sid)) for i, sid in enumerate(ids)
            ]
        finally:
            torch.random.set_rng_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])
        return collate(outputs, alloc, batch_number)

    def _one(
        self, batch: Mapping[str, Any], i: int, epoch: int, batch_number: int, sid: int
    ) -> Mapping[str, Any]:
        sample: dict[str, Any] = {}
        for name, column in batch.items():
            value = column[i]
            if name in self.images and isinstance(value, bytes | bytearray | memoryview):
                value = self.decoder(bytes(value), what=f"sample {sid} column {name!r}")
            elif isinstance(value, np.ndarray):
                value = torch.from_numpy(value)
            elif isinstance(value, np.generic):
                value = value.item()
            sample[name] = value
        seed = sample_seed(self.seed, epoch, batch_number, sid)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
        out = self.transform(sample)
        if not isinstance(out, Mapping):
            raise ConfigError(
                f"sample_transform must return a dict (column -> value), got "
                f"{type(out).__name__} for sample {sid}"
            )
        return out


def collate(
    outputs: Sequence[Mapping[str, Any]],
    alloc: Callable[[str, tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]],
    batch_number: int,
) -> dict[str, Any]:
    """One batch of the samples ``outputs``: equal tensors stacked into ``alloc``'s memory,
    numbers into tensors, anything else into lists."""
    names = list(outputs[0])
    for out in outputs[1:]:
        if list(out) != names:
            raise ConfigError(
                f"sample_transform returned keys {sorted(out)} and {sorted(names)} in batch "
                f"{batch_number}; every sample needs the same keys"
            )
    return {name: _column(name, [out[name] for out in outputs], alloc) for name in names}


def _column(
    name: str,
    values: list[Any],
    alloc: Callable[[str, tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]],
) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        try:
            np_dtype = np.dtype(str(first.dtype).removeprefix("torch."))
        except TypeError:  # bfloat16 and friends: no numpy twin, a plain stack
            return torch.stack(values)
        out = torch.from_numpy(alloc(name, (len(values), *first.shape), np_dtype))
        torch.stack(values, out=out)
        return out
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        arr = alloc(name, (len(values), *first.shape), first.dtype)
        np.stack(values, out=arr)
        return torch.from_numpy(arr)
    for kind, dtype in ((bool, np.bool_), (int, np.int64), (float, np.float64)):
        if all(isinstance(v, kind) for v in values):
            arr = alloc(name, (len(values),), np.dtype(dtype))
            arr[:] = values
            return torch.from_numpy(arr)
    return values
