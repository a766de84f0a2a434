"""``RandomResizedCropFlip``: the ImageNet training augmentation, on the CPU or on a device.

One object describes the augmentation (output size, scale and ratio ranges, flip
probability, optional normalisation to a training dtype) and runs it two ways:

* as a ``sample_transform`` (the CPU path): in the loader's workers, per sample, on the
  decoded image, with torchvision's ``resized_crop`` (antialiased) and ``hflip``;
* handed over (the device path, :class:`~shardstream.client.batches.image_stage.ImageStage`):
  the workers only read each image's size from its header, draw its box, and hand the
  encoded bytes and the boxes to a stage that decodes and crops the whole batch at once.

Both draw a sample's box and flip with :meth:`RandomResizedCropFlip.draw` from a generator
seeded with :func:`~shardstream.client.batches.sample_transform.sample_seed` (the CPU path: the
default generator, which :class:`SampleStage` seeds before each sample), so both paths
choose identical boxes, and a resumed run draws the boxes an uninterrupted one would.
``draw`` is torchvision's ``RandomResizedCrop.get_params`` followed by
``RandomHorizontalFlip``'s coin, in that order: a ``v2.Compose`` of the two in a
``sample_transform`` picks the same boxes too.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardstream.client.batches.sample_transform import collate
from shardstream.errors import ConfigError, CorruptShardError

__all__ = ["RandomResizedCropFlip", "image_size"]

Box = tuple[int, int, int, int, int]
"""``(top, left, height, width, flip)`` of one sample's crop, in pixels of the image."""

OFFSETS = "{}.offsets"
BOXES = "{}.boxes"
"""Batch keys of a handed-over image column's byte offsets and boxes."""


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """Crop a random area (``scale`` of the image, aspect ``ratio``), resize it to
    ``size`` (antialiased bilinear), flip it left-right with probability ``flip``.

    ``mean``/``std`` (in 0-255 pixel units' fraction, torchvision's convention: e.g.
    ``(0.485, 0.456, 0.406)``) normalise to ``dtype`` (e.g. ``torch.bfloat16``); without
    them the output stays ``uint8``. ``column`` names the image column; other columns
    pass through.

    >>> augment = RandomResizedCropFlip(224)
    >>> ds = StreamingDataset(url, 128, sample_transform=augment)   # doctest: +SKIP
    >>> loader = ShardstreamLoader(ds, num_workers=4, device="cuda")  # doctest: +SKIP
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    column: str = "image"
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        size = self.out_size
        if min(size) < 1:
            raise ConfigError(f"RandomResizedCropFlip size must be >= 1, got {self.size}")
        if not 0 < self.scale[0] <= self.scale[1] or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ConfigError(
                f"RandomResizedCropFlip needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= "
                f"ratio[1], got scale={self.scale} ratio={self.ratio}"
            )
        if not 0 <= self.flip <= 1:
            raise ConfigError(f"RandomResizedCropFlip flip must be in [0, 1], got {self.flip}")
        if (self.mean is None) != (self.std is None):
            raise ConfigError("RandomResizedCropFlip needs both mean and std, or neither")

    @property
    def out_size(self) -> tuple[int, int]:
        """``(height, width)`` of the output."""
        return (self.size, self.size) if isinstance(self.size, int) else self.size

    def draw(self, height: int, width: int, generator: torch.Generator) -> Box:
        """The box and flip of one image (torchvision's algorithm, on ``generator``)."""
        area = height * width
        log_ratio: Any = torch.log(torch.tensor(self.ratio))  # tensors, as torchvision
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale, generator=generator).item()
            aspect = torch.exp(
                torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)
            ).item()
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator))
                left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator))
                break
        else:  # fallback to a central crop
            in_ratio = width / height
            if in_ratio < min(self.ratio):
                w, h = width, round(width / min(self.ratio))
            elif in_ratio > max(self.ratio):
                h, w = height, round(height * max(self.ratio))
            else:
                w, h = width, height
            top, left = (height - h) // 2, (width - w) // 2
        flip = int(torch.rand(1, generator=generator).item() < self.flip)
        return top, left, h, w, flip

    def finish(self, pixels: torch.Tensor) -> torch.Tensor:
        """Float pixels (0-255) of ``(..., C, H, W)`` to the output dtype."""
        if self.mean is None or self.std is None:
            return pixels.round_().clamp_(0, 255).to(torch.uint8)
        shape = (-1, 1, 1)
        mean = torch.tensor(self.mean, device=pixels.device).view(shape) * 255
        std = torch.tensor(self.std, device=pixels.device).view(shape) * 255
        return ((pixels - mean) / std).to(self.dtype)

    # -- the CPU path: a sample_transform ----------------------------------------------

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        """Augment one decoded sample (draws from torch's default generator)."""
        from torchvision.transforms.v2 import functional as tvf

        image = _rgb(sample[self.column])
        height, width = image.shape[-2:]
        top, left, h, w, flip = self.draw(height, width, torch.default_generator)
        out = tvf.resized_crop(image, top, left, h, w, list(self.out_size), antialias=True)
        if flip:
            out = tvf.horizontal_flip(out)
        if self.mean is not None:
            out = self.finish(out.float())
        return {**sample, self.column: out}

    # -- the device path: the workers' part ---------------------------------------------

    def hand_over(
        self,
        batch: Mapping[str, Any],
        *,
        seeds: Sequence[int],
        alloc: Any,
    ) -> dict[str, Any]:
        """The batch with its image column as one byte buffer, offsets and boxes.

        Each sample's box is drawn from a generator seeded with ``seeds[i]`` (the seed
        the CPU path gives that sample), using the size in the image's header.
        """
        images = [bytes(v) for v in batch[self.column]]
        offsets = alloc(OFFSETS.format(self.column), (len(images) + 1,), np.dtype(np.int64))
        offsets[0] = 0
        offsets[1:] = np.cumsum([len(data) for data in images])
        packed = alloc(self.column, (int(offsets[-1]),), np.dtype(np.uint8))
        boxes = alloc(BOXES.format(self.column), (len(images), 5), np.dtype(np.int64))
        generator = torch.Generator()
        for i, data in enumerate(images):
            packed[offsets[i] : offsets[i + 1]] = np.frombuffer(data, np.uint8)
            generator.manual_seed(seeds[i])
            boxes[i] = self.draw(*image_size(data, what=f"sample {i}"), generator)
        rest = [
            {name: _plain(col[i]) for name, col in batch.items() if name != self.column}
            for i in range(len(images))
        ]
        out = collate(rest, alloc, 0) if rest and rest[0] else {}
        return {
            self.column: torch.from_numpy(packed),
            OFFSETS.format(self.column): torch.from_numpy(offsets),
            BOXES.format(self.column): torch.from_numpy(boxes),
            **out,
        }


def _rgb(image: torch.Tensor) -> torch.Tensor:
    """3 channels, as the device path's decoder gives (gray repeated, alpha dropped)."""
    if image.shape[0] == 1:
        return image.expand(3, *image.shape[1:])
    return image[:3]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes, *, what: str) -> tuple[int, int]:
    """``(height, width)`` from an encoded image's header (JPEG, PNG; else Pillow)."""
    if data[:2] == b"\xff\xd8":
        pos = 2
        while pos + 9 <= len(data):
            if data[pos] != 0xFF:
                break
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in _SOF:
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return height, width
            pos += 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
    elif data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return height, width
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size[1], img.size[0]
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise CorruptShardError(f"{what}: cannot read the image's size ({exc})") from exc
