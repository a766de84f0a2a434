"""Checking that an image decodes, and the optional resize + re-encode.

Images are stored as their original bytes, checked at build time rather than in the
middle of someone's training run. Two levels:

* ``quick`` (default): a JPEG must start with SOI and end with EOI, a PNG with its
  signature and end with the IEND chunk - the check for truncation, the usual damage
  (partial copies and downloads), at the cost of two slices. A file that fails it, or is
  another format, is decoded in full to decide, so odd but valid files (data after EOI)
  still pass.
* ``full``: every image is decoded (JPEGs in draft mode at 1/8 scale, which still reads
  the whole entropy-coded stream) - several times slower.
"""

from __future__ import annotations

import re
from io import BytesIO

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_EOI = b"\xff\xd9"
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # length 0, type, CRC: always these bytes


class BadImageError(Exception):
    """The bytes are not an image Pillow can decode; the message says why."""


def sniff_format(data: bytes) -> str:
    """``"jpeg"``, ``"png"`` or ``"bytes"`` from the leading magic bytes."""
    if data.startswith(_JPEG_MAGIC):
        return "jpeg"
    if data.startswith(_PNG_MAGIC):
        return "png"
    return "bytes"


def column_encoding(first: bytes | None) -> str:
    """The image column's encoding for images sniffed from their first: ``png`` for a PNG,
    else ``jpeg`` (never ``bytes``: readers decode a ``jpeg`` value by its content, and
    every stored image passed :func:`check_image`)."""
    return "png" if first is not None and sniff_format(first) == "png" else "jpeg"


def _looks_complete(data: bytes) -> bool:
    if data.startswith(_JPEG_MAGIC):
        return data.rstrip(b"\x00\r\n ").endswith(_JPEG_EOI)
    if data.startswith(_PNG_MAGIC):
        return data.endswith(_PNG_IEND)
    return False


def check_image(
    data: bytes, *, resize: int | None = None, jpeg_quality: int = 90, verify: str = "quick"
) -> bytes:
    """The bytes to store: ``data`` itself, or a re-encoding with the shorter side ``resize``.

    ``verify`` is ``"quick"`` (structure; full decode only if that fails) or ``"full"``.
    Raises :class:`BadImageError` when Pillow cannot decode the image.
    """
    if resize is None and verify == "quick" and _looks_complete(data):
        return data
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
        # Without object addresses ("<_io.BytesIO object at 0x7f...>"): the reason is kept
        # in shardstream.json, which must not depend on the process that checked the image.
        reason = _ADDRESS.sub("", str(exc))
        raise BadImageError(f"{type(exc).__name__}: {reason}") from None
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
