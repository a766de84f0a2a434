"""Checking that an image decodes, and the optional resize + re-encode.

Images are stored as their original bytes. To find undecodable files at build time
(rather than in the middle of someone's training run) every image is decoded once: JPEGs
in draft mode at 1/8 scale, which still reads the whole entropy-coded stream (so a
truncated or garbled file fails) at a fraction of the cost of a full decode.
"""

from __future__ import annotations

from io import BytesIO

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class BadImageError(Exception):
    """The bytes are not an image Pillow can decode; the message says why."""


def sniff_format(data: bytes) -> str:
    """``"jpeg"``, ``"png"`` or ``"bytes"`` from the leading magic bytes."""
    if data.startswith(_JPEG_MAGIC):
        return "jpeg"
    if data.startswith(_PNG_MAGIC):
        return "png"
    return "bytes"


def check_image(data: bytes, *, resize: int | None = None, jpeg_quality: int = 90) -> bytes:
    """The bytes to store: ``data`` itself, or a re-encoding with the shorter side ``resize``.

    Raises :class:`BadImageError` when Pillow cannot decode the image.
    """
    from PIL import Image

    try:
        with Image.open(BytesIO(data)) as im:
            fmt = im.format or "PNG"
            if resize is not None and min(im.size) > resize:
                return _resized(im, fmt, resize, jpeg_quality)
            if fmt == "JPEG":
                im.draft(im.mode, (1, 1))  # smallest DCT scale: cheap, yet reads every byte
            im.load()
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, EOFError, ...
        raise BadImageError(f"{type(exc).__name__}: {exc}") from None
    return data


def _resized(im: object, fmt: str, resize: int, quality: int) -> bytes:
    from PIL import Image

    assert isinstance(im, Image.Image)
    width, height = im.size
    scale = resize / min(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if fmt == "JPEG":
        im.draft(im.mode, size)  # decode at the nearest DCT scale above the target
    im.load()
    out_format = "JPEG" if fmt == "JPEG" else "PNG"
    small = im.resize(size, Image.Resampling.BICUBIC)
    if out_format == "JPEG" and small.mode not in ("RGB", "L", "CMYK"):
        small = small.convert("RGB")
    buf = BytesIO()
    if out_format == "JPEG":
        small.save(buf, format="JPEG", quality=quality)
    else:
        small.save(buf, format="PNG")
    return buf.getvalue()
