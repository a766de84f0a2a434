"""WebDataset ``.tar`` shards: members grouped into samples by key, as WebDataset does.

A member ``dir/abc.seg.jpg`` has key ``dir/abc`` and column ``seg.jpg``; consecutive members
with the same key form one sample. Each extension maps to an MDS encoding: images stay
encoded bytes (``jpeg``/``png`` where the MDS encoding exists), ``cls``/``label`` -> int,
``txt`` -> str, ``json`` -> json, ``npy`` -> ndarray, anything else -> bytes. Sources are
local files or folders, ``s3://`` objects or prefixes, and ``http(s)://`` URLs, with brace
ranges (``s3://bucket/wds/shard-{000000..000099}.tar``). Each sample's key is kept as the
``str`` column ``__key__`` (the first column; ``--no-key`` leaves it out). A remote shard
is downloaded by the worker that reads it (size-checked, retried as every store read) into
a temporary file, read, and deleted. Tars are read from their headers directly
(:mod:`.tar`).
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from shardstream.errors import InputError
from shardstream.shard_builder.importers.npy import load_npy
from shardstream.shard_builder.importers.source import Column, ImportFormat, Record, SourceUnit
from shardstream.shard_builder.importers.tar import tar_members
from shardstream.shard_builder.inputs import resolve_inputs

KEY_COLUMN = "__key__"
"""The column that keeps each sample's WebDataset key (its identity: users join and
deduplicate by it), as WebDataset's own loader names it."""
KEEP_KEY = "key"  # the unit option when keys are kept

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_KEY = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


def expand_braces(pattern: str) -> list[str]:
    """``a-{00..02}.tar`` -> ``a-00.tar a-01.tar a-02.tar`` (zero padding kept; nests)."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    lo, hi = match.group(1), match.group(2)
    width = len(lo) if lo.startswith("0") else 0
    if int(hi) < int(lo):
        raise InputError(f"{pattern}: brace range {match.group(0)} runs backwards")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    out: list[str] = []
    for n in range(int(lo), int(hi) + 1):
        out.extend(expand_braces(f"{head}{n:0{width}d}{tail}"))
    return out


def plan(inputs: tuple[str, ...], option: str = "") -> list[SourceUnit]:
    names = [name for arg in inputs for name in expand_braces(arg)]
    local = [n for n in names if not _remote(n)]
    files = resolve_inputs(local, (".tar",), confined=True) if local else []
    units = [SourceUnit(str(f.path), f.size, f.mtime_ns) for f in files]
    for name in (n for n in names if _remote(n)):
        units.extend(_remote_units(name))
    return units


def _remote(name: str) -> bool:
    return name.split("://", 1)[0].lower() in ("s3", "http", "https")


def _split(url: str) -> tuple[str, str]:
    parent, _, key = url.rstrip("/").rpartition("/")
    return parent, key


def _remote_units(url: str) -> list[SourceUnit]:
    """The ``.tar`` objects ``url`` names: one object, or every ``.tar`` under an ``s3://``
    prefix (in key order)."""
    from shardstream.storage import open_store

    if url.lower().endswith(".tar"):
        parent, key = _split(url)
        size = open_store(parent).size(key)
        if size is None:
            raise InputError(f"{url}: no such object")
        return [SourceUnit(url, size)]
    if not url.lower().startswith("s3://"):
        raise InputError(f"{url}: name .tar files by URL (an http(s) folder cannot be listed)")
    store = open_store(url)
    found = sorted((k, n) for k, n in store.list("") if k.endswith(".tar"))
    if not found:
        raise InputError(f"{url}: no .tar objects under this prefix")
    return [SourceUnit(f"{url.rstrip('/')}/{k}", n) for k, n in found]


def decode_member(ext: str, data: bytes, where: str) -> Column:
    """The MDS encoding and value of one member, by its (last) extension."""
    last = ext.rsplit(".", 1)[-1].lower()
    try:
        if last in ("jpg", "jpeg"):
            return "jpeg", data
        if last == "png":
            return "png", data
        if last in ("cls", "cls2", "label", "index", "id"):
            return "int", int(data.decode().strip())
        if last in ("txt", "text"):
            return "str", data.decode("utf-8")
        if last == "json":
            return "json", json.loads(data)
        if last == "npy":
            return "ndarray", load_npy(data)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested too deeply
        raise InputError(f"{where}.{ext}: cannot read the {last} member ({exc})") from exc
    return "bytes", data


def read(unit: SourceUnit) -> Iterator[Record]:
    keep_key = unit.option == KEEP_KEY
    if not _remote(unit.path):
        yield from _read_tar(unit.path, unit.path, keep_key)
        return
    from shardstream.storage import open_store

    parent, key = _split(unit.path)
    with tempfile.TemporaryDirectory(prefix="shardstream-wds-") as tmp:
        local = Path(tmp) / "shard.tar"
        open_store(parent).download(key, local, expected_size=unit.nbytes)
        yield from _read_tar(str(local), unit.path, keep_key)


def _read_tar(path: str, label: str, keep_key: bool = True) -> Iterator[Record]:
    """The samples of the tar at ``path`` (``label`` is what errors call it), each with its
    key as the str column ``__key__`` first when ``keep_key``."""
    key: str | None = None
    sample: dict[str, Column] = {}
    for member, data in tar_members(path, label):
        match = _KEY.match(member)
        if match is None:
            continue
        name, ext = match.group(1), match.group(2)
        if key is not None and name != key:
            yield f"{label} key {key}", sample
            sample = {}
        key = name
        where = f"{label} key {key}"
        if not sample and keep_key:
            sample[KEY_COLUMN] = ("str", _key_text(key, where))
        if ext in sample:
            what = "clashes with the key column" if ext == KEY_COLUMN else "appears twice"
            raise InputError(f"{where}: member .{ext} {what} in one sample")
        sample[ext] = decode_member(ext, data, where)
    if key is not None:
        yield f"{label} key {key}", sample


def _key_text(key: str, where: str) -> str:
    """``key`` as it is stored (UTF-8 text): a member name that is not UTF-8 (read with
    surrogate escapes) is named rather than failing in the encoder."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            f"{where}: the key is not UTF-8 text; pass --no-key to import without keys"
        ) from None
    return key


FORMAT = ImportFormat("webdataset", plan, read)
