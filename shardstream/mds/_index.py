"""``index.json`` of an MDS v2 dataset: :class:`MDSIndex`, :class:`ShardInfo`, :func:`load_index`.

The JSON layout is MosaicML Streaming's (``{"version": 2, "shards": [...]}``, keys sorted,
``json.dumps`` default separators), so an index we write is byte-identical to the one
``streaming.MDSWriter`` writes for the same shards. Loading validates every field and
raises :class:`FormatError` naming the file, the shard and the field.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardstream.errors import ConfigError, FormatError
from shardstream.mds._blocks import (
    BlockDigests,
    HeaderDigest,
    is_digests_key,
    parse_block_digests,
    parse_header_digest,
)
from shardstream.mds._compression import check_compression
from shardstream.mds._encodings import get_codec
from shardstream.mds._pieces import PieceSpec, parse_piece_spec

INDEX_BASENAME = "index.json"
"""File name of the index beside the shards."""


@dataclass(frozen=True)
class FileInfo:
    """One shard file as recorded in the index: name, size in bytes, hex digests."""

    basename: str
    bytes: int
    hashes: Mapping[str, str] = field(default_factory=dict)

    @property
    def file_hashes(self) -> dict[str, str]:
        """The whole-file digests only: ``hashes`` without the per-block digest list."""
        return {algo: h for algo, h in self.hashes.items() if not is_digests_key(algo)}

    def to_dict(self) -> dict[str, Any]:
        """The JSON object MosaicML writes for a file."""
        return {"basename": self.basename, "bytes": self.bytes, "hashes": dict(self.hashes)}


@dataclass(frozen=True)
class ShardInfo:
    """One shard's entry in ``index.json`` (format ``"mds"``, version 2).

    ``raw_data`` describes the uncompressed shard file; ``zip_data`` the compressed file
    that is stored instead when ``compression`` is set (``None`` otherwise).
    """

    column_encodings: tuple[str, ...]
    column_names: tuple[str, ...]
    column_sizes: tuple[int | None, ...]
    compression: str | None
    hashes: tuple[str, ...]
    raw_data: FileInfo
    samples: int
    size_limit: int | None
    zip_data: FileInfo | None = None
    format: str = "mds"
    version: int = 2

    @property
    def stored(self) -> FileInfo:
        """The file that is actually stored: ``zip_data`` if compressed, else ``raw_data``."""
        return self.zip_data if self.zip_data is not None else self.raw_data

    @property
    def block_digests(self) -> BlockDigests | None:
        """Per-block digests of the raw file (``None``: compressed, or written without them).

        Parsed from ``raw_data.hashes`` on each access (a few microseconds, no hidden state).

        They are an entry of ``raw_data.hashes`` (see ``shardstream.mds._blocks``); use
        :func:`~shardstream.mds.blocks_for_range` and :func:`~shardstream.mds.verify_range`.
        """
        if self.compression is not None:
            return None  # a range of one zstd frame cannot be read on its own
        raw = self.raw_data
        return parse_block_digests(raw.hashes, raw.bytes, raw.basename)

    @property
    def header_digest(self) -> HeaderDigest | None:
        """The digest of the raw file's header bytes (``None``: compressed, or an index
        written without it); a ranged reader verifies the header it fetched against it."""
        if self.compression is not None:
            return None
        raw = self.raw_data
        return parse_header_digest(raw.hashes, raw.bytes, raw.basename)

    @property
    def piece_spec(self) -> PieceSpec | None:
        """Where the raw file's piece table is and its digest (``None``: compressed, or
        written without one; ``shardstream.mds._pieces``)."""
        if self.compression is not None:
            return None
        raw = self.raw_data
        return parse_piece_spec(raw.hashes, raw.bytes, raw.basename, self.header_digest)

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding, in shard order (sorted by name)."""
        return dict(zip(self.column_names, self.column_encodings, strict=True))

    def config(self) -> dict[str, Any]:
        """The writer configuration that MosaicML also embeds in the shard header."""
        return {
            "column_encodings": list(self.column_encodings),
            "column_names": list(self.column_names),
            "column_sizes": list(self.column_sizes),
            "compression": self.compression,
            "format": self.format,
            "hashes": list(self.hashes),
            "size_limit": self.size_limit,
            "version": self.version,
        }

    def to_dict(self) -> dict[str, Any]:
        """The shard's JSON object in ``index.json``."""
        obj = self.config()
        obj["raw_data"] = self.raw_data.to_dict()
        obj["samples"] = self.samples
        obj["zip_data"] = None if self.zip_data is None else self.zip_data.to_dict()
        return obj

    @classmethod
    def from_dict(cls, obj: Any, *, where: str = "index.json") -> ShardInfo:
        """Validate and load one shard object; ``where`` names it in errors."""
        return _parse_shard(obj, where)


@dataclass
class MDSIndex:
    """An MDS v2 ``index.json``: the list of shards in order."""

    shards: list[ShardInfo] = field(default_factory=list)
    version: int = 2

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return sum(shard.samples for shard in self.shards)

    def to_json(self) -> str:
        """The index as MosaicML writes it (sorted keys, default separators)."""
        obj = {"version": self.version, "shards": [s.to_dict() for s in self.shards]}
        return json.dumps(obj, sort_keys=True)

    def write(self, path: Path) -> None:
        """Write the index to ``path`` atomically (temp file in the same folder + rename)."""
        write_atomic(Path(path), self.to_json().encode("utf-8"))


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that readers see either nothing or all of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_index(source: bytes | str | Path) -> MDSIndex:
    """Load and validate an ``index.json`` given as its bytes (or text) or a path to it.

    Raises :class:`FormatError` (naming the file, shard and field) for anything that is not
    an MDS v2 index, and :class:`UnsupportedEncodingError` for column encodings we cannot read.
    """
    if isinstance(source, str) and source.lstrip().startswith("{"):
        source = source.encode("utf-8")  # JSON text rather than a path
    if isinstance(source, bytes):
        where, data = "index.json", source
    else:
        where = str(source)
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise FormatError(f"{where}: cannot read the index: {exc.strerror}") from exc
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError(f"{where}: JSON nested too deeply to be an MDS index") from None
    return index_from_json(obj, where)


def index_from_json(obj: Any, where: str = "index.json") -> MDSIndex:
    """Validate an already parsed ``index.json`` object (see :func:`load_index`)."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: expected a JSON object with 'version' and 'shards'")
    if obj.get("version") != 2:
        raise FormatError(
            f"{where}: field 'version' is {obj.get('version')!r}; only MDS index version 2 "
            "is supported (re-write the dataset with mosaicml-streaming >= 0.5 or shardstream)"
        )
    shards = obj.get("shards")
    if not isinstance(shards, list):
        raise FormatError(f"{where}: field 'shards' must be a list")
    seen: dict[_Columns, _Columns] = {}  # shards share their columns: check each set once
    return MDSIndex([_parse_shard(s, f"{where}: shard {i}", seen) for i, s in enumerate(shards)])


def _field(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise FormatError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FormatError(f"{where}: field {key!r} has the wrong type ({value!r})")
    return value


# Raw shards are addressed by uint32 offsets; a compressed file is bounded to int64 so that
# every consumer (numpy plans, HTTP ranges) can hold its size.
_MAX_RAW_BYTES = (1 << 32) - 1
_MAX_FILE_BYTES = (1 << 63) - 1
_MAX_NAME = 1024


_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and backslashes


def _bad_basename(name: str) -> bool:
    """Whether ``name`` is not a plain relative key (it must never leave the dataset root)."""
    if not name or len(name) > _MAX_NAME or name[0] == "/" or _CONTROL.search(name):
        return True
    if "/" not in name:  # the usual case: one plain file name
        return name in (".", "..") or len(name) > 255
    return any(part in ("", ".", "..") or len(part) > 255 for part in name.split("/"))


def check_shard_basename(name: str) -> str:
    """Return ``name`` if a shard may be written under it, else raise :class:`ConfigError`.

    A shard's basename is a plain file name (``shard.00000.mds``) or one relative to a
    sub-folder of the dataset (``1f0c/shard.00000.mds``, see ``spread_key``): the same keys
    the index accepts, and no segment may start with ``.`` (the codec's temp files do).
    """
    if _bad_basename(name) or any(part.startswith(".") for part in name.split("/")):
        raise ConfigError(
            f"shard basename must be a file name, optionally under sub-folders, with no "
            f"empty, '.'-leading or '..' segment (like 'shard.00000.mds' or "
            f"'1f0c/shard.00000.mds'), got {name[:300]!r}"
        )
    return name


def _parse_file(obj: Any, where: str, *, max_bytes: int = _MAX_FILE_BYTES) -> FileInfo:
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: expected an object with basename, bytes, hashes")
    basename = _field(obj, "basename", str, where)
    if _bad_basename(basename):
        raise FormatError(
            f"{where}: field 'basename' {basename[:300]!r} is not a relative file name"
        )
    size = _field(obj, "bytes", int, where)
    if not 0 <= size <= max_bytes:
        raise FormatError(f"{where}: field 'bytes' is {size}, expected 0 to {max_bytes}")
    hashes = _field(obj, "hashes", dict, where)
    if not all(isinstance(v, str) for v in hashes.values()):
        raise FormatError(f"{where}: field 'hashes' holds a value that is not a string")
    return FileInfo(basename, size, dict(hashes))


_Columns = tuple[tuple[str, ...], tuple[str, ...], tuple[int | None, ...]]


def _parse_columns(obj: dict[str, Any], where: str, seen: dict[_Columns, _Columns]) -> _Columns:
    """(names, encodings, sizes), checked; ``seen`` remembers sets already checked."""
    names = _field(obj, "column_names", list, where)
    encodings = _field(obj, "column_encodings", list, where)
    sizes = _field(obj, "column_sizes", list, where)
    try:
        key: _Columns = (tuple(names), tuple(encodings), tuple(sizes))
        hit = seen.get(key)
    except TypeError:  # an unhashable entry: invalid, reported below
        hit = None
    if hit is not None:
        return hit
    if not (len(names) == len(encodings) == len(sizes)) or not names:
        raise FormatError(
            f"{where}: column_names, column_encodings and column_sizes must be non-empty "
            "lists of the same length"
        )
    if not all(isinstance(name, str) and name for name in names):
        bad = next(name for name in names if not isinstance(name, str) or not name)
        raise FormatError(f"{where}: column name {bad!r} is not a non-empty string")
    if len(set(names)) != len(names):
        dupes = sorted({name for name in names if names.count(name) > 1})
        raise FormatError(f"{where}: field 'column_names' lists {dupes} more than once")
    for name, encoding, size in zip(names, encodings, sizes, strict=True):
        try:
            codec = get_codec(encoding)
        except FormatError as exc:
            raise type(exc)(f"{where}: column {name!r}: {exc}") from None
        if size != codec.size or type(size) not in (int, type(None)):
            raise FormatError(
                f"{where}: column {name!r} ({encoding}) has column_sizes entry {size!r}, "
                f"expected {codec.size!r}"
            )
    seen[key] = key
    return key


def _parse_shard(obj: Any, where: str, seen: dict[_Columns, _Columns] | None = None) -> ShardInfo:
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: expected a JSON object")
    raw_obj = obj.get("raw_data")
    if isinstance(raw_obj, dict) and isinstance(raw_obj.get("basename"), str):
        where = f"{where} ({raw_obj['basename'][:300]})"
    if obj.get("format") != "mds":
        raise FormatError(f"{where}: field 'format' is {obj.get('format')!r}, expected 'mds'")
    if obj.get("version") != 2:
        raise FormatError(f"{where}: field 'version' is {obj.get('version')!r}, expected 2")
    names, encodings, sizes = _parse_columns(obj, where, {} if seen is None else seen)
    compression = obj.get("compression")
    try:
        check_compression(compression, writing=False)
    except Exception as exc:
        raise FormatError(f"{where}: field 'compression': {exc}") from None
    hashes = _field(obj, "hashes", list, where)
    if not all(isinstance(h, str) for h in hashes):
        raise FormatError(f"{where}: field 'hashes' must list algorithm names (strings)")
    samples = _field(obj, "samples", int, where)
    # A sample costs at least its 4-byte offset in a file under 4 GiB.
    if not 0 <= samples < _MAX_RAW_BYTES // 4:
        raise FormatError(
            f"{where}: field 'samples' is {samples}; a shard holds 0 to {_MAX_RAW_BYTES // 4 - 1}"
        )
    size_limit = obj.get("size_limit")
    if size_limit is not None and (
        type(size_limit) is not int or not 0 <= size_limit <= _MAX_FILE_BYTES
    ):
        raise FormatError(
            f"{where}: field 'size_limit' is {size_limit!r}, expected null or a byte count"
        )
    raw = _parse_file(raw_obj, f"{where}: raw_data", max_bytes=_MAX_RAW_BYTES)
    if 4 * (samples + 2) > raw.bytes:
        raise FormatError(
            f"{where}: field 'samples' is {samples}, but a raw file of {raw.bytes} bytes "
            "cannot hold that many sample offsets"
        )
    zip_obj = obj.get("zip_data")
    zip_data = None if zip_obj is None else _parse_file(zip_obj, f"{where}: zip_data")
    if (zip_data is None) != (compression is None):
        raise FormatError(f"{where}: zip_data must be given exactly when compression is set")
    parse_block_digests(raw.hashes, raw.bytes, f"{where}: raw_data")
    head = parse_header_digest(raw.hashes, raw.bytes, f"{where}: raw_data")
    parse_piece_spec(raw.hashes, raw.bytes, f"{where}: raw_data", head)
    return ShardInfo(
        column_encodings=encodings,
        column_names=names,
        column_sizes=sizes,
        compression=compression,
        hashes=tuple(hashes),
        raw_data=raw,
        samples=samples,
        size_limit=size_limit,
        zip_data=zip_data,
    )
