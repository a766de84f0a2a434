"""Decoding stored JPEG/PNG bytes into pixels with the fastest decoder this install has.

Measured on ImageNet-like JPEGs (500 x 375, ~100 KB, one core; docs/vision.md): Pillow
1.24 ms, ``torchcodec.decoders.decode_jpeg`` 1.03 ms, ``torchvision.io.decode_jpeg``
1.02 ms, ``simplejpeg`` 1.00 ms per image - the fast ones wrap libjpeg-turbo without
Pillow's per-image object overhead. For images far
larger than the training resolution, decoding at a reduced DCT scale (``min_size``:
Pillow's draft mode, simplejpeg's ``min_height``/``min_width``) halves the cost again
(2000 x 1500: 13.1 ms full, 5.6-6.3 ms at 1/4 scale).

``auto`` takes ``torchcodec`` for JPEGs (it returns ``(C, H, W)`` tensors, the layout
torchvision's transforms work in; torchvision's own decoders are deprecated in its favour
since torchvision 0.29), else ``torchvision``, else ``simplejpeg``, else Pillow; with
``min_size``,
``simplejpeg`` else Pillow (torchvision cannot decode at a reduced scale). Pillow decodes
every other format, and any image a fast decoder refuses (CMYK JPEGs, odd markers), so
the choice of decoder never changes which images load.
"""

from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shardstream.client.options import DecodeOptions, check_image_options
from shardstream.errors import ConfigError, CorruptShardError

__all__ = ["ImageDecoder", "available_decoders", "decode_on_device"]


_JPEG_MAGIC = b"\xff\xd8\xff"


_PROBE = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDABALDA4MChAODQ4SERATGCgaGBYWGDEjJR0oOjM9PDkzODdASFxOQERX"
    "RTc4UG1RV19iZ2hnPk1xeXBkeFxlZ2P/2wBDARESEhgVGC8aGi9jQjhCY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2Nj"
    "Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2P/wAARCAAIAAgDASIAAhEBAxEB/8QAFQABAQAAAAAAAAAAAAAAAAAA"
    "AAX/xAAUEAEAAAAAAAAAAAAAAAAAAAAA/8QAFQEBAQAAAAAAAAAAAAAAAAAABAb/xAAUEQEAAAAAAAAAAAAAAAAA"
    "AAAA/9oADAMBAAIRAxEAPwCOACqH/9k="
)
"""An 8 x 8 red JPEG: a decoder that decodes it is installed and working."""


def available_decoders() -> list[str]:
    """The JPEG decoders that work here, fastest first (Pillow always)."""
    found = [name for name in _FAST if _works(name)]
    return [*found, "pillow"]


@functools.cache
def _works(name: str) -> bool:
    """Whether decoder ``name`` imports and decodes (a wheel may install yet fail to load
    its native library, e.g. beside another torch)."""
    try:
        pixels = _FAST[name](ImageDecoder("pillow", "HWC", "RGB"), _PROBE)
    except Exception:  # ImportError, OSError, RuntimeError: all mean "not usable here"
        return False
    return bool(pixels.shape == (8, 8, 3) and int(pixels[..., 0].mean()) > 150)


@dataclass(frozen=True)
class ImageDecoder:
    """Bytes -> pixels: ``uint8`` ``(H, W, C)`` numpy arrays (``layout="HWC"``) or
    ``(C, H, W)`` tensors (``layout="CHW"``), always with a channel axis (a grayscale
    image has ``C == 1``, as torchvision's decoders give it), whichever decoder ran.

    ``mode``: ``None`` keeps the stored channels (gray 1, gray + alpha 2, RGB 3, RGBA 4),
    except where they are no colours a model can train on: CMYK and YCCK JPEGs become RGB,
    palette PNGs RGB (RGBA with a transparent colour), 1-bit images gray (0 or 255).
    ``"RGB"`` or ``"L"`` converts every image. ``min_size``: decode JPEGs at the smallest
    DCT scale (1/2, 1/4, 1/8) whose shorter side is still at least this many pixels.
    """

    name: str = "auto"
    layout: str = "HWC"
    mode: str | None = None
    min_size: int | None = None

    def __post_init__(self) -> None:
        check_image_options(self.name, self.layout, self.mode, self.min_size)
        if self.name not in ("auto", "pillow") and not _works(self.name):
            raise ConfigError(
                f"image_decoder={self.name!r} is not installed here; installed: "
                f"{available_decoders()} (pip install {self.name})"
            )

    @classmethod
    def of(cls, options: DecodeOptions) -> ImageDecoder:
        """The decoder ``options`` describe (:class:`ConfigError` if it is not installed)."""
        return cls(
            options.image_decoder, options.image_layout, options.image_mode, options.decode_min_size
        )

    @property
    def jpeg_decoder(self) -> str:
        """The decoder JPEGs go to."""
        if self.name != "auto":
            return self.name
        order = ("simplejpeg",) if self.min_size is not None else tuple(_FAST)
        return next((name for name in order if _works(name)), "pillow")

    def __call__(self, data: bytes, *, what: str) -> Any:
        """Decode ``data``; :class:`CorruptShardError` naming ``what`` if nothing can."""
        if data.startswith(_JPEG_MAGIC):
            fast = _FAST.get(self.jpeg_decoder)
            if fast is not None:
                try:
                    return fast(self, data)
                except (RuntimeError, ValueError, OSError):
                    pass  # Pillow decides: it reads more variants, else says what is wrong
        return self._pillow(data, what)

    def _pillow(self, data: bytes, what: str) -> Any:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as img:
                if self.min_size is not None and img.format == "JPEG":
                    img.draft(img.mode, _draft_size(img.size, self.min_size))
                target = self.mode or _STORED_AS.get(img.mode)
                if img.mode == "P" and self.mode is None and "transparency" in img.info:
                    target = "RGBA"
                if target is not None and img.mode != target:
                    converted = img.convert(target)
                else:
                    img.load()
                    converted = img
                pixels = np.asarray(converted)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            raise CorruptShardError(f"{what}: cannot decode image ({exc})") from exc
        return self._layout_of_hwc(pixels)

    def _layout_of_hwc(self, pixels: np.ndarray[Any, Any]) -> Any:
        if pixels.ndim == 2:  # Pillow's and simplejpeg's gray: give it its channel axis
            pixels = pixels[..., np.newaxis]
        if self.layout == "HWC":
            return pixels
        if not pixels.flags.writeable:  # Pillow's arrays are read-only views
            pixels = pixels.copy()
        return torch.from_numpy(np.ascontiguousarray(pixels)).permute(2, 0, 1)


# Pillow modes that ``mode=None`` converts: what they hold is no image a model trains on
# as it is (palette indices, booleans, ink amounts); the fast decoders agree (``_from_chw``).
_STORED_AS = {"1": "L", "P": "RGB", "PA": "RGBA", "CMYK": "RGB", "YCbCr": "RGB", "LAB": "RGB"}
_STORED_AS |= {"HSV": "RGB", "La": "LA", "RGBa": "RGBA", "RGBX": "RGB"}


def _draft_size(size: tuple[int, int], min_size: int) -> tuple[int, int]:
    """The size to ask Pillow's draft for so that the shorter side stays >= ``min_size``
    (draft picks the smallest scale at least this large)."""
    width, height = size
    scale = min_size / max(1, min(width, height))
    return max(1, int(width * scale + 0.999)), max(1, int(height * scale + 0.999))


def _torchcodec(dec: ImageDecoder, data: bytes) -> Any:
    from torchcodec.decoders import ImageReadMode, decode_jpeg  # type: ignore[attr-defined]

    modes = {None: ImageReadMode.UNCHANGED, "RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY}
    chw = decode_jpeg(data, mode=modes[dec.mode])
    assert isinstance(chw, torch.Tensor)  # one image in, one tensor out
    if chw.shape[0] == 4:  # a CMYK JPEG as stored: RGB, as from every decoder
        return _torchcodec(ImageDecoder("pillow", dec.layout, "RGB", dec.min_size), data)
    return _from_chw(dec, chw)


def _torchvision(dec: ImageDecoder, data: bytes) -> Any:
    import warnings

    from torchvision.io import ImageReadMode, decode_jpeg

    mode = {None: ImageReadMode.UNCHANGED, "RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY}
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with warnings.catch_warnings():  # deprecated for torchcodec, which we prefer if installed
        warnings.simplefilter("ignore", DeprecationWarning)
        chw = decode_jpeg(raw, mode=mode[dec.mode])
        if chw.shape[0] == 4:  # a CMYK JPEG as stored: RGB, as from every decoder
            chw = decode_jpeg(raw, mode=ImageReadMode.RGB)
    return _from_chw(dec, chw)


def _from_chw(dec: ImageDecoder, chw: torch.Tensor) -> Any:
    if dec.layout == "CHW":
        return chw
    return chw.permute(1, 2, 0).numpy()


def _simplejpeg(dec: ImageDecoder, data: bytes) -> Any:
    import simplejpeg

    if dec.mode is None:
        colorspace = "GRAY" if simplejpeg.decode_jpeg_header(data)[2] == "Gray" else "RGB"
    else:
        colorspace = "GRAY" if dec.mode == "L" else "RGB"
    kwargs: dict[str, int] = {}
    if dec.min_size is not None:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        scale = dec.min_size / max(1, min(width, height))
        kwargs = {"min_height": int(height * scale), "min_width": int(width * scale)}
    pixels = simplejpeg.decode_jpeg(data, colorspace=colorspace, **kwargs)  # (H, W, C)
    return dec._layout_of_hwc(pixels)


_FAST: dict[str, Callable[[ImageDecoder, bytes], Any]] = {
    "torchcodec": _torchcodec,
    "torchvision": _torchvision,
    "simplejpeg": _simplejpeg,
}


def decode_on_device(
    images: Sequence[bytes], device: str | torch.device = "cuda", *, mode: str = "RGB"
) -> list[torch.Tensor]:
    """Decode a batch of encoded images on ``device`` (nvJPEG on a GPU), as ``(C, H, W)``
    ``uint8`` tensors there.

    For a training loop that reads batches with ``DecodeOptions(decode_images=False)`` and
    decodes in the training process, where the GPU is: JPEGs go in one call to
    ``torchcodec`` (else ``torchvision``) with ``device``; other formats are decoded by
    Pillow and copied over. ``mode`` is ``"RGB"`` or ``"L"``.
    """
    if mode not in ("RGB", "L"):
        raise ConfigError(f"mode must be 'RGB' or 'L', got {mode!r}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device {str(device)!r}: torch {torch.__version__} sees no CUDA device here; "
            "decode on 'cpu' or run on a GPU node"
        )
    out: list[torch.Tensor | None] = [None] * len(images)
    jpegs = [i for i, data in enumerate(images) if bytes(data[:3]) == _JPEG_MAGIC]
    if jpegs:
        decoded = _decode_jpegs_on([bytes(images[i]) for i in jpegs], torch.device(device), mode)
        for i, tensor in zip(jpegs, decoded, strict=True):
            out[i] = tensor
    cpu = ImageDecoder("pillow", "CHW", mode)
    for i in range(len(out)):
        if out[i] is None:
            out[i] = cpu(bytes(images[i]), what=f"image {i} of the batch").to(device)
    return [t for t in out if t is not None]


def _decode_jpegs_on(data: list[bytes], device: torch.device, mode: str) -> list[torch.Tensor]:
    if _works("torchcodec"):
        from torchcodec.decoders import ImageReadMode, decode_jpeg  # type: ignore[attr-defined]

        read = ImageReadMode.RGB if mode == "RGB" else ImageReadMode.GRAY
        tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
        decoded = decode_jpeg(tensors, mode=read, device=device)
        return list(decoded) if isinstance(decoded, list) else [decoded]
    import warnings

    from torchvision.io import ImageReadMode as TvMode
    from torchvision.io import decode_jpeg as tv_decode_jpeg

    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        decoded = tv_decode_jpeg(
            tensors, mode=TvMode.RGB if mode == "RGB" else TvMode.GRAY, device=device
        )
    return list(decoded)
