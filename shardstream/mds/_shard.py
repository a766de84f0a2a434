"""Building MDS shard files: from encoded samples, and the vectorized path for fixed-size columns.

A raw (uncompressed) MDS shard is, all integers little-endian uint32::

    num_samples | offsets[num_samples + 1] | config JSON | sample 0 | sample 1 | ...

``offsets[i]`` is the byte position of sample ``i`` in the file and ``offsets[-1]`` the
file size. The config JSON is the shard's writer settings (what ``ShardInfo.config()``
returns, ``json.dumps(..., sort_keys=True)``). One sample is the uint32 sizes of its
variable-size columns, then every column's bytes, columns sorted by name.

MosaicML starts a new shard when the next sample would make the file bigger than
``size_limit``; :func:`samples_per_shard` gives that count for all-fixed-size columns.

Uncompressed shards also get per-block digests (``shardstream.mds._blocks``) unless
``block_size=None``; they are an extra entry of ``raw_data.hashes`` and change no shard byte.
They also get a piece table at the end of the header (``shardstream.mds._pieces``) unless
``piece_size=None``: the config JSON is then followed by 8 bytes per 64 KiB of samples.

Files are written as a hidden temp file (``.<name>.*.tmp``) in the same folder and renamed,
so a shard name only ever points at a complete file; a killed writer may leave temp files.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from shardstream.errors import ConfigError, InputError
from shardstream.hashing import hash_bytes, new_hasher
from shardstream.mds._blocks import (
    BLOCK_DIGEST_ALGO,
    BlockHasher,
    HeaderHasher,
    check_block_size,
    digests_key,
)
from shardstream.mds._compression import compress, compression_extension
from shardstream.mds._format import (
    DEFAULT_FORMAT,
    MAX_SHARD_BYTES,
    ShardFormat,
    ShardFormatKeywords,
)
from shardstream.mds._index import FileInfo, ShardInfo, check_shard_basename
from shardstream.mds._pieces import (
    check_piece_size,
    piece_table,
    pieces_entry,
    table_length,
)
from shardstream.mds._sample import parse_columns

_MAX_BYTES = MAX_SHARD_BYTES
# Bytes fed to every hasher (and the file) in turn: small enough to stay in the CPU's
# cache from one hasher to the next. With 4 MiB steps each hasher read the step from
# memory again, and hashing a shard took up to twice as long.
_HASH_STEP = 256 << 10


def shard_config(
    columns: Mapping[str, str],
    *,
    compression: str | None,
    hashes: Sequence[str],
    size_limit: int | None,
) -> ShardInfo:
    """A :class:`ShardInfo` template (no files yet) with validated settings."""
    parse_columns(columns)  # the columns are checked first
    return format_template(
        columns, ShardFormat(compression=compression, hashes=tuple(hashes), size_limit=size_limit)
    )


def format_template(columns: Mapping[str, str], fmt: ShardFormat) -> ShardInfo:
    """The :class:`ShardInfo` template (no files yet) of ``columns`` written as ``fmt``."""
    cols = parse_columns(columns)
    return ShardInfo(
        column_encodings=tuple(codec.encoding for _, codec in cols),
        column_names=tuple(name for name, _ in cols),
        column_sizes=tuple(codec.size for _, codec in cols),
        compression=fmt.compression,
        hashes=fmt.hashes,
        raw_data=FileInfo("", 0),
        samples=0,
        size_limit=fmt.size_limit,
    )


def config_bytes(info: ShardInfo) -> bytes:
    """The config JSON embedded in a shard's header, byte-identical to MosaicML's."""
    return json.dumps(info.config(), sort_keys=True).encode("utf-8")


def samples_per_shard(
    columns: Mapping[str, str],
    size_limit: int | None,
    *,
    compression: str | None = DEFAULT_FORMAT.compression,
    hashes: Sequence[str] = DEFAULT_FORMAT.hashes,
) -> int:
    """How many samples of all-fixed-size ``columns`` MosaicML's rule puts in one shard.

    A shard holds ``n`` samples when ``8 + len(config) + n * (sample_size + 4)`` is at most
    ``size_limit``; at least 1 (a sample larger than the limit gets a shard of its own).
    Returns ``2**32 - 1`` when ``size_limit`` is ``None``.
    """
    template = shard_config(columns, compression=compression, hashes=hashes, size_limit=size_limit)
    stride = _fixed_stride(template)
    if template.size_limit is None:
        return _MAX_BYTES - 1
    room = template.size_limit - 8 - len(config_bytes(template))
    return max(1, room // (stride + 4))


def _fixed_stride(info: ShardInfo) -> int:
    if any(size is None for size in info.column_sizes):
        variable = [n for n, s in zip(info.column_names, info.column_sizes, strict=True) if not s]
        raise ConfigError(f"columns {variable} are variable-size; this path needs fixed-size ones")
    return sum(size for size in info.column_sizes if size is not None)


def write_shard(
    path: Path,
    basename: str,
    columns: Mapping[str, str],
    encoded: Sequence[bytes],
    *,
    fmt: ShardFormat = DEFAULT_FORMAT,
    **keywords: Unpack[ShardFormatKeywords],
) -> ShardInfo:
    """Write one shard from already-encoded samples (see :func:`encode_sample`).

    ``path`` is the dataset directory; the shard is written there as ``basename`` (e.g.
    ``shard.00000.mds``, or ``1f0c/shard.00000.mds`` in a sub-folder), or as
    ``basename + ".zstd"`` when compressed, via a temp file and a rename, as ``fmt``
    (:class:`ShardFormat`) with the settings given as keywords (``compression="zstd"``).
    Its ``size_limit`` is only recorded (the caller decides what goes in a shard).
    Returns the index entry.
    """
    parse_columns(columns)  # the columns are checked first
    fmt = fmt.with_keywords(keywords)
    template = format_template(columns, fmt)
    sizes = [len(e) for e in encoded]
    return write_samples(
        Path(path),
        basename,
        template,
        sizes,
        encoded,
        block_size=fmt.block_size,
        piece_size=fmt.piece_size,
    )


def write_samples(
    out_dir: Path,
    basename: str,
    template: ShardInfo,
    sizes: Sequence[int],
    parts: Sequence[bytes | memoryview],
    *,
    block_size: int | None = DEFAULT_FORMAT.block_size,
    piece_size: int | None = DEFAULT_FORMAT.piece_size,
) -> ShardInfo:
    """Write a shard whose samples, of byte ``sizes``, are the concatenation of ``parts``.

    ``template`` comes from :func:`shard_config`. Samples may be split into several parts
    (the writer keeps a sample's columns apart), which saves copying them before the write.
    """
    config = config_bytes(template)
    piece_size = _pieces_for(template, block_size, piece_size)
    table = piece_table(parts, piece_size) if piece_size else b""
    config += table  # the table ends the header (after the config JSON)
    n = len(sizes)
    head_len = 4 * (n + 2) + len(config)
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = head_len
    np.cumsum(np.asarray(sizes, np.int64), out=offsets[1:])
    offsets[1:] += head_len
    _check_total(int(offsets[-1]), basename)
    head = np.uint32(n).tobytes() + offsets.astype("<u4").tobytes()
    pieces = pieces_entry(table, piece_size) if piece_size else None
    return _store(
        out_dir, basename, template, [head, config, *parts], n, block_size=block_size, pieces=pieces
    )


def write_shard_arrays(
    path: Path,
    basename: str,
    columns: Mapping[str, str],
    arrays: Mapping[str, np.ndarray[Any, Any]],
    *,
    fmt: ShardFormat = DEFAULT_FORMAT,
    **keywords: Unpack[ShardFormatKeywords],
) -> ShardInfo:
    """Write one shard of all-fixed-size columns from whole arrays, with no per-sample Python.

    ``arrays[name]`` holds every sample of a column stacked on axis 0: shape
    ``(n, *shape)`` with the exact dtype for ``ndarray:<dtype>:<shape>``, ``(n,)`` for scalar
    encodings (``int`` is int64). The bytes are identical to :func:`write_shard` over the
    same samples. Offsets are computed by arithmetic and the file is assembled in one buffer.
    Use :func:`samples_per_shard` to cut the input into shards. ``fmt`` and ``keywords``
    as for :func:`write_shard`.
    """
    parse_columns(columns)  # the columns are checked first
    fmt = fmt.with_keywords(keywords)
    block_size = fmt.block_size
    template = format_template(columns, fmt)
    stride = _fixed_stride(template)
    config = config_bytes(template)
    lengths = {len(a) for a in arrays.values() if isinstance(a, np.ndarray) and a.ndim}
    if len(lengths) != 1:
        raise InputError(f"{basename}: arrays must be numpy arrays of one common length")
    (n,) = lengths
    piece_size = _pieces_for(template, block_size, fmt.piece_size)
    table_len = table_length(n * stride, piece_size) if piece_size else 0
    head_len = 4 * (n + 2) + len(config) + table_len
    _check_total(head_len + n * stride, basename)
    raw = np.empty(head_len + n * stride, np.uint8)
    raw[:4] = np.frombuffer(np.uint32(n).tobytes(), np.uint8)
    offsets = head_len + stride * np.arange(n + 1, dtype=np.int64)
    raw[4 : 4 * (n + 2)] = offsets.astype("<u4").view(np.uint8)
    raw[4 * (n + 2) : head_len - table_len] = np.frombuffer(config, np.uint8)
    body = raw[head_len:].reshape(n, stride)
    pos = 0
    for name, codec in parse_columns(columns):
        if name not in arrays:
            raise InputError(f"{basename}: no array for column {name!r}")
        arr = arrays[name]
        assert codec.dtype is not None and codec.shape is not None and codec.size
        if arr.dtype != codec.dtype or arr.shape[1:] != codec.shape:
            raise InputError(
                f"{basename}: column {name!r} ({codec.encoding}) needs dtype {codec.dtype.name} "
                f"and shape (n, {', '.join(map(str, codec.shape))}), got {arr.dtype} {arr.shape}"
            )
        body[:, pos : pos + codec.size] = (
            np.ascontiguousarray(arr).view(np.uint8).reshape(n, codec.size)
        )
        pos += codec.size
    pieces = None
    if piece_size:
        table = piece_table([raw.data[head_len:]], piece_size)
        raw[head_len - table_len : head_len] = np.frombuffer(table, np.uint8)
        pieces = pieces_entry(table, piece_size)
    return _store(
        Path(path), basename, template, [raw.data], n, block_size=block_size, pieces=pieces
    )


def _pieces_for(template: ShardInfo, block_size: int | None, piece_size: int | None) -> int | None:
    """The piece size a shard gets: none when compressed, without block digests (the
    header digest that covers the table comes with them) or when pieces would not be
    smaller than blocks."""
    block_size = check_block_size(block_size)
    piece_size = check_piece_size(piece_size)
    if template.compression is not None or block_size is None or piece_size is None:
        return None
    return piece_size if piece_size < block_size else None


def _check_total(total: int, basename: str) -> None:
    if total >= _MAX_BYTES:
        raise InputError(
            f"{basename}: shard would be {total} bytes; MDS offsets are uint32, so a shard "
            "must stay under 4 GiB (lower size_limit)"
        )


def _store(
    out_dir: Path,
    basename: str,
    template: ShardInfo,
    parts: Sequence[bytes | memoryview],
    n: int,
    *,
    block_size: int | None,
    pieces: tuple[str, str] | None = None,
) -> ShardInfo:
    """Hash (and compress) the raw shard ``parts`` and write the stored file atomically;
    ``pieces`` is the piece table's ``raw_data.hashes`` entry, if it has one."""
    check_shard_basename(basename)  # may name a sub-folder: "1f0c/shard.00000.mds"
    block_size = check_block_size(block_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_hashers = {algo: new_hasher(algo) for algo in template.hashes}
    # Block digests serve ranged reads, which compressed shards cannot have.
    blocks = header = None
    if block_size is not None and template.compression is None:
        blocks, header = BlockHasher(BLOCK_DIGEST_ALGO, block_size), HeaderHasher()
    zip_info = None
    if template.compression is not None:
        # zstd's one-shot frame is what MosaicML writes: compress one joined buffer.
        raw = parts[0] if len(parts) == 1 else b"".join(parts)
        for hasher in raw_hashers.values():
            hasher.update(raw)
        data = compress(template.compression, raw)
        zip_name = f"{basename}.{compression_extension(template.compression)}"
        zip_info = FileInfo(zip_name, len(data), {a: hash_bytes(a, data) for a in template.hashes})
        parts = [data]
    target = out_dir / (zip_info.basename if zip_info else basename)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            # Uncompressed: hash and write part by part, never joining the shard in memory.
            for part in parts:
                if zip_info is not None:
                    fh.write(part)
                    continue
                view = memoryview(part).cast("B") if len(part) > _HASH_STEP else part
                for at in range(0, len(view), _HASH_STEP):
                    step = view[at : at + _HASH_STEP] if view is not part else part
                    for hasher in raw_hashers.values():
                        hasher.update(step)
                    if blocks is not None and header is not None:
                        blocks.update(step)
                        header.update(step)
                    fh.write(step)
            size = fh.tell()
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    raw_size = size if zip_info is None else len(raw)
    raw_hashes = {a: h.hexdigest() for a, h in raw_hashers.items()}
    if blocks is not None:
        raw_hashes[digests_key(BLOCK_DIGEST_ALGO, blocks.block_size)] = blocks.finish().hex
        head = header.finish() if header is not None else None
        if head is not None:
            raw_hashes[head[0]] = head[1]
        if pieces is not None:
            raw_hashes[pieces[0]] = pieces[1]
    raw_info = FileInfo(basename, raw_size, raw_hashes)
    return ShardInfo(
        column_encodings=template.column_encodings,
        column_names=template.column_names,
        column_sizes=template.column_sizes,
        compression=template.compression,
        hashes=template.hashes,
        raw_data=raw_info,
        samples=n,
        size_limit=template.size_limit,
        zip_data=zip_info,
    )
