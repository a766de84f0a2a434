"""Shard compression, named as MosaicML names it (``"zstd"``, ``"zstd:7"``).

We write zstd only. The frames are byte-identical to mosaicml-streaming's (which uses the
``zstd`` package): libzstd's multithreaded mode (``threads >= 1``) produces the same output
for any worker count, and that is the mode the ``zstd`` package uses. We read zstd, and
also gz and bz2 shards from the standard library, for datasets written by others.
"""

from __future__ import annotations

import bz2
import gzip
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import IO

import zstandard

from shardstream.errors import ConfigError, CorruptShardError, FormatError

_LEVELS = {"zstd": range(1, 23), "gz": range(10), "bz2": range(1, 10)}
_DEFAULT_LEVEL = {"zstd": 3, "gz": 9, "bz2": 9}
_WRITABLE = ("zstd",)
_CHUNK = 8 << 20


def check_compression(name: str | None, *, writing: bool) -> str | None:
    """Validate a compression name (``None``, ``"zstd"`` or ``"zstd:<1-22>"``).

    Raises :class:`ConfigError` for a name we cannot write (``writing=True``) or read.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise ConfigError(f"compression must be a string like 'zstd' or 'zstd:7', got {name!r}")
    family, _, level = name.partition(":")
    families = _WRITABLE if writing else tuple(_LEVELS)
    ok = family in families and (not level or (level.isdigit() and int(level) in _LEVELS[family]))
    if not ok:
        raise ConfigError(
            f"unsupported compression {name!r}; use {' or '.join(families)}, optionally with "
            "':<level>' (zstd levels 1-22)"
        )
    return name


def compression_extension(name: str) -> str:
    """File name extension of compressed shards (``shard.00000.mds.zstd``)."""
    return name.partition(":")[0]


def compress(name: str, data: bytes | memoryview) -> bytes:
    """Compress ``data`` exactly as ``streaming.base.compression.compress`` would."""
    check_compression(name, writing=True)
    family, _, level = name.partition(":")
    lvl = int(level) if level else _DEFAULT_LEVEL[family]
    return zstandard.ZstdCompressor(level=lvl, threads=1).compress(data)


def _copy_decompressed(family: str, src: IO[bytes], dst: IO[bytes]) -> None:
    if family in ("gz", "bz2"):
        opened = gzip.GzipFile(fileobj=src) if family == "gz" else bz2.BZ2File(src)
        with opened as stream:  # both raise EOFError on truncated input
            shutil.copyfileobj(stream, dst, _CHUNK)
        return
    # Frame by frame, so that a truncated last frame is an error, not a short file.
    dctx = zstandard.ZstdDecompressor()
    obj = dctx.decompressobj()
    started = False
    while chunk := src.read(_CHUNK):
        while chunk:
            started = True
            dst.write(obj.decompress(chunk))
            chunk = obj.unused_data if obj.eof else b""
            if obj.eof:
                obj, started = dctx.decompressobj(), False
    if started or dst.tell() == 0:
        raise EOFError("the last zstd frame is incomplete")


def decompress_stream(compression: str, src: IO[bytes], dst: IO[bytes]) -> None:
    """Decompress the stream ``src``, compressed as ``compression`` (``"zstd:7"``), into ``dst``.

    For bytes already verified against the index (a shard fetched whole into memory), so
    the codec's own errors (``zstandard.ZstdError``, ``EOFError``, ``zlib.error``) pass
    through untranslated; :func:`decompress_shard` names the file for a shard on disk.
    """
    _copy_decompressed(compression_extension(compression), src, dst)


def decompress_shard(
    src: Path, dst: Path, compression: str, *, expected_size: int | None = None
) -> None:
    """Decompress the shard file ``src`` into ``dst``, atomically (temp file + rename).

    Streams in chunks, so memory stays small for large shards. Raises
    :class:`CorruptShardError` naming ``src`` if the data does not decompress or, when
    ``expected_size`` is given (``ShardInfo.raw_data.bytes``), has another length.
    """
    src, dst = Path(src), Path(dst)
    try:
        check_compression(compression, writing=False)
    except ConfigError as exc:
        raise FormatError(f"{src}: {exc}") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            decompress_stream(compression, fin, fout)
            size = fout.tell()
        if expected_size is not None and size != expected_size:
            raise CorruptShardError(
                f"{src}: decompresses to {size} bytes, the index records {expected_size}; "
                "the shard is truncated or corrupt, download it again"
            )
        os.replace(tmp, dst)
    except (zstandard.ZstdError, OSError, EOFError, zlib.error) as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, FileNotFoundError) and not src.exists():
            raise
        raise CorruptShardError(
            f"{src}: the {compression} data does not decompress ({exc}); the shard is "
            "truncated or corrupt, download it again"
        ) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
