"""``ImageStage``: decode and augment whole image batches on a device (a GPU, or the CPU).

The loader's workers hand over each batch's encoded images as one byte buffer with the
boxes and flips drawn for them (:meth:`RandomResizedCropFlip.hand_over`); the stage:

1. decodes the batch in one call: nvImageCodec on a GPU where it is installed (the A100's
   and H100's hardware JPEG decoder), else nvJPEG through torchcodec/torchvision
   (``decode_jpeg(list, device=...)``); on ``device="cpu"``, libjpeg-turbo the same way.
   Images the fast decoder refuses (CMYK on nvJPEG, PNG, anything odd) are decoded by
   Pillow on the CPU and copied over: never dropped;
2. crops, resizes and flips the whole batch with two batched matrix products: for each
   image a row-weight and a column-weight matrix (antialiased bilinear, the weights
   torchvision's ``resize(antialias=True)`` uses; a flip reverses the column weights),
   so ``out = Ry @ crop @ Rx^T`` for all images at once, with no per-image kernel;
3. normalises to the training dtype.

On a GPU it runs on its own CUDA stream in a thread that stays ``ahead`` batches in front
of the training loop (each batch is finished on its stream before it is handed over), so
the training step neither waits for it nor shares its stream.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from shardstream.client.batches.image_augment import BOXES, OFFSETS, RandomResizedCropFlip
from shardstream.client.batches.image_decode import ImageDecoder, _decode_jpegs_on, _works

__all__ = ["ImageStage", "resize_weights"]

_JPEG_MAGIC = b"\xff\xd8\xff"

JpegDecoder = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]
"""Encoded JPEGs (``uint8`` CPU tensors) -> ``(3, H, W)`` ``uint8`` tensors on the device;
raises if it refuses any of them."""


class ImageStage:
    """Turns handed-over batches into augmented image tensors on ``device``."""

    def __init__(
        self,
        augment: RandomResizedCropFlip,
        device: str | torch.device,
        *,
        ahead: int = 2,
        jpeg_decoder: JpegDecoder | None = None,
    ) -> None:
        self.augment = augment
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"ImageStage device={str(device)!r}, but torch sees no CUDA device here "
                f"(torch {torch.__version__}, cuda {torch.version.cuda})"
            )
        self.ahead = max(1, ahead)
        self.jpeg_decoder = jpeg_decoder or _best_jpeg_decoder(self.device)
        self._pillow = ImageDecoder("pillow", "CHW", "RGB")

    # -- one batch ----------------------------------------------------------------------

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its image column decoded and augmented, everything on device."""
        column = self.augment.column
        packed = batch.pop(column)
        offsets = batch.pop(OFFSETS.format(column)).tolist()
        boxes = batch.pop(BOXES.format(column))
        encoded = [packed[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
        images = self.decode(encoded)
        out = {column: self.crop(images, boxes)}
        for name, value in batch.items():
            moved = isinstance(value, torch.Tensor)
            out[name] = value.to(self.device, non_blocking=True) if moved else value
        return out

    def decode(self, encoded: list[torch.Tensor]) -> list[torch.Tensor]:
        """``(3, H, W)`` ``uint8`` images on the device: JPEGs in one call, the rest (and
        any JPEG the fast decoder refuses) by Pillow."""
        out: list[torch.Tensor | None] = [None] * len(encoded)
        jpegs = [i for i, data in enumerate(encoded) if bytes(data[:3].tolist()) == _JPEG_MAGIC]
        if jpegs:
            decoded: list[torch.Tensor | None]
            try:
                decoded = list(self.jpeg_decoder([encoded[i] for i in jpegs], self.device))
            except Exception:  # one refused image fails the call: find it image by image
                decoded = [self._one_fast(encoded[i]) for i in jpegs]
            for i, fast in zip(jpegs, decoded, strict=True):
                out[i] = fast
        images = []
        for i, fast in enumerate(out):
            if fast is None or fast.shape[0] != 3:
                pixels = self._pillow(bytes(encoded[i].numpy()), what=f"image {i} of the batch")
                fast = pixels.to(self.device)  # noqa: PLW2901  (the CPU's decode replaces it)
            images.append(fast)
        return images

    def _one_fast(self, data: torch.Tensor) -> torch.Tensor | None:
        try:
            return self.jpeg_decoder([data], self.device)[0]
        except Exception:  # refused: Pillow decodes it (or says what is wrong)
            return None

    def crop(self, images: list[torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
        """Crop ``boxes`` (``(B, 5)``: top, left, height, width, flip) out of ``images``,
        resize to the output size and flip, as two batched matrix products."""
        out_h, out_w = self.augment.out_size
        box = boxes.tolist()
        max_h = max(b[2] for b in box)
        max_w = max(b[3] for b in box)
        crops = torch.zeros((len(images), 3, max_h, max_w), device=self.device)
        for k, (image, (top, left, h, w, _)) in enumerate(zip(images, box, strict=True)):
            crops[k, :, :h, :w] = image[:, top : top + h, left : left + w]  # one copy kernel
        boxes = boxes.to(self.device)
        rows = resize_weights(boxes[:, 2], out_h, max_h)  # (B, out_h, max_h)
        cols = resize_weights(boxes[:, 3], out_w, max_w)  # (B, out_w, max_w)
        flip = boxes[:, 4].bool().view(-1, 1, 1)
        cols = torch.where(flip, cols.flip(1), cols)
        pixels = rows.unsqueeze(1) @ crops @ cols.transpose(1, 2).unsqueeze(1)
        return self.augment.finish(pixels)

    # -- ahead of the training loop -------------------------------------------------------

    def run(self, batches: Iterator[tuple[int, dict[str, Any]]]) -> StageRun:
        """Process ``batches`` in a thread, ``ahead`` batches in front of the consumer."""
        return StageRun(self, batches)


class StageRun:
    """One pass through the stage: iterate it for ``(b, batch)``; :meth:`stop` ends it."""

    def __init__(self, stage: ImageStage, batches: Iterator[tuple[int, dict[str, Any]]]) -> None:
        self._stage = stage
        self._batches = batches
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=stage.ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="shardstream-image-stage")
        self._thread.daemon = True
        self._thread.start()

    def _produce(self) -> None:
        stage = self._stage
        cuda = stage.device.type == "cuda"
        stream = torch.cuda.Stream(stage.device) if cuda else None  # type: ignore[no-untyped-call]
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for b, batch in self._batches:
                    out = stage(batch)
                    if stream is not None:  # done before its bytes' slot goes back
                        stream.synchronize()
                    if not self._put(("batch", (b, out))):
                        return
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(("error", exc))
        finally:
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.1)
                return True
        return False

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        cuda = self._stage.device.type == "cuda"
        while True:
            kind, value = self._queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            if cuda:  # memory made on the stage's stream, now used on the trainer's
                current = torch.cuda.current_stream(self._stage.device)
                for tensor in value[1].values():
                    if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                        tensor.record_stream(current)
            yield value

    def stop(self) -> None:
        """End the thread (it finishes the batch in hand first)."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.1)
        self._thread.join()


def resize_weights(sizes: torch.Tensor, out: int, width: int) -> torch.Tensor:
    """``(B, out, width)`` antialiased bilinear weights resizing ``sizes[k]`` pixels to
    ``out`` (PIL's and torchvision's ``antialias=True`` filter: a triangle stretched by the
    downscale factor, each row normalised; columns past ``sizes[k]`` weigh 0)."""
    sizes = sizes.to(torch.float64).view(-1, 1, 1)
    scale = sizes / out
    support = scale.clamp(min=1.0)
    center = scale * (torch.arange(out, dtype=torch.float64, device=sizes.device) + 0.5).view(
        1, -1, 1
    )
    j = torch.arange(width, dtype=torch.float64, device=sizes.device).view(1, 1, -1)
    weights = (1 - ((j + 0.5 - center) / support).abs()).clamp(min=0)
    weights = weights * (j < sizes)
    weights = weights / weights.sum(dim=2, keepdim=True)
    return weights.to(torch.float32)


def _best_jpeg_decoder(device: torch.device) -> JpegDecoder:
    """nvImageCodec on a GPU where it imports, else torchcodec/torchvision (nvJPEG on a GPU,
    libjpeg-turbo on the CPU)."""
    if device.type == "cuda" and _nvimgcodec() is not None:
        return _decode_nvimgcodec
    if _works("torchcodec") or _works("torchvision"):
        return _decode_torch
    return _decode_none


def _decode_torch(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _decode_jpegs_on([bytes(t.numpy()) for t in data], device, "RGB")


def _decode_none(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    raise RuntimeError("no fast JPEG decoder installed")  # Pillow decodes every image


_NVIMGCODEC: list[Any] = []


def _nvimgcodec() -> Any:
    """A shared nvImageCodec decoder, or None where the package is not installed."""
    if not _NVIMGCODEC:
        try:
            from nvidia import nvimgcodec  # type: ignore[import-untyped,import-not-found,unused-ignore]

            _NVIMGCODEC.append(nvimgcodec.Decoder())
        except Exception:  # not installed, or no usable GPU backend
            _NVIMGCODEC.append(None)
    return _NVIMGCODEC[0]


def _decode_nvimgcodec(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    decoder = _nvimgcodec()
    decoded = decoder.decode([bytes(t.numpy()) for t in data])
    out = []
    for image in decoded:
        if image is None:  # refused: raise, so the stage finds it and Pillow decodes it
            raise RuntimeError("nvImageCodec refused an image")
        hwc = torch.as_tensor(image, device=device)
        out.append(hwc.permute(2, 0, 1))
    return out
