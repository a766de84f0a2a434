"""The regular-file members of a tar, read straight from its 512-byte headers.

A WebDataset shard is a tar of small members (a few KB each), and Python's ``tarfile``
spends tens of microseconds of Python on every header (WebDataset's writer also puts a pax
header before each member, which doubles that): more than the rest of an import's work
per sample. Here the file is mapped and each header costs a checksum, an octal number and
a name: ustar headers (``prefix`` + ``name``), pax extended headers (``path``, ``size``)
and GNU long names (``L``) are read as ``tarfile`` reads them, and members that are not
regular files (folders, links) are passed over. Anything rarer (a pax global header that
sets a path or size) hands the tar to ``tarfile``, which goes on after the members already
read. Sparse members are refused: their holes would be expanded in memory to the size the
header declares, however few bytes the file holds.

Damage is an :class:`InputError` naming the file and the member: a header whose checksum
does not match, a member whose data runs past the end of the file, and a file that ends
without the end-of-archive block (``tarfile`` in stream mode stops there without a word,
so a shard cut at a header boundary lost its last samples silently).
"""

from __future__ import annotations

import itertools
import mmap
import os
import tarfile
from collections.abc import Iterator

from shardstream.errors import InputError

BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")  # tarfile's REGULAR_TYPES, sparse files aside
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, folders, fifos: no data
_GLOBAL_KEYS = ("path", "size", "GNU.sparse")  # a global header with these: left to tarfile
ENCODING = "utf-8"  # tarfile's default (the file system encoding) on Linux and macOS


class _UnsupportedError(Exception):
    """A feature this reader leaves to ``tarfile``."""


def tar_members(path: str, label: str) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of every regular file in the tar at ``path``, in order (``label``
    is what errors call the file)."""
    done = 0
    try:
        for member in _members(path, label):
            yield member
            done += 1
    except _UnsupportedError:
        yield from itertools.islice(_tarfile_members(path, label), done, None)
    except OSError as exc:
        raise InputError(f"{label}: cannot read the tar ({exc})") from exc


def _members(path: str, label: str) -> Iterator[tuple[str, bytes]]:
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if not size:
            raise InputError(f"{label}: empty file, not a tar")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from _walk(data, size, label)


def _walk(data: mmap.mmap, end: int, label: str) -> Iterator[tuple[str, bytes]]:
    pos = 0
    long_name: str | None = None  # from a GNU ``L`` member, for the next header
    pax: dict[str, str] = {}  # from a pax ``x`` header, for the next header
    last = "the first member"
    first = data[:BLOCK]
    if end < BLOCK or (first.count(0) < BLOCK and not _checksum_ok(first)):
        raise InputError(f"{label}: not a tar file ({_not_a_tar(first, end)})")
    while True:
        if pos + BLOCK > end:
            where = f"after {last}" if pos < end else f"after {last}: no end-of-archive block"
            raise InputError(f"{label}: truncated tar {where} (byte {pos} of {end})")
        header = data[pos : pos + BLOCK]
        if header[0] == 0 and header.count(0) == BLOCK:
            return  # the end-of-archive block
        if not _checksum_ok(header):
            raise InputError(f"{label}: damaged tar: bad header checksum after {last} (byte {pos})")
        kind = header[156:157]
        name = _name(header)
        size = _number(header[124:136], label, pos)
        start = pos + BLOCK
        if kind in (b"x", b"g", b"L", b"K"):
            if start + size > end:
                raise InputError(
                    f"{label}: truncated tar: the extended header after {last} (byte {pos}) "
                    f"needs {size} bytes, the file ends at byte {end}"
                )
            body = data[start : start + size]
            if kind == b"x":
                pax = _pax(body, label, pos)
            elif kind == b"g" and any(k.startswith(_GLOBAL_KEYS) for k in _pax(body, label, pos)):
                raise _UnsupportedError
            elif kind == b"L":
                long_name = _nts(body)
            pos = start + _padded(size)
            continue
        if kind == b"\0" and _nts(header[:100]).endswith("/"):
            kind = b"5"  # an old-style folder
        if long_name is not None:
            name = long_name
        if "path" in pax:
            name = pax["path"]
        if kind == b"S" or any(k.startswith("GNU.sparse.") for k in pax):
            raise _sparse_error(label, pax.get("GNU.sparse.name", name), pos)
        if "size" in pax:
            size = _pax_size(pax["size"], label, pos)
        long_name, pax = None, {}
        if kind in _REGULAR:
            last = f"member {name!r}"
            if start + size > end:
                raise InputError(
                    f"{label}: truncated tar: member {name!r} (header at byte {pos}) needs "
                    f"{size} bytes, the file ends {end - start} bytes into it"
                )
            yield name, data[start : start + size]
        pos = start if kind in _NO_DATA else start + _padded(size)


def _sparse_error(label: str, name: str, pos: int) -> InputError:
    """A sparse member: refused, because reading it means filling its holes with zeros up
    to the size it declares, which nothing bounds (a 2.5 KB tar declaring 1 GiB cost 3.2 GiB
    of memory). WebDataset writers never write sparse members; ``tar --sparse`` does."""
    return InputError(
        f"{label}: member {name!r} (header at byte {pos}) is a sparse file, which an import "
        "does not read (its holes would be expanded in memory); re-create the tar without "
        "--sparse"
    )


_MAGICS = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ": "xz"}


def _not_a_tar(head: bytes, size: int) -> str:
    """Why the start of a file is no tar header, for the error (a ``.jsonl`` or a
    compressed tar passed as a shard was reported as a "truncated tar")."""
    for magic, name in _MAGICS.items():
        if head.startswith(magic):
            return f"{name}-compressed: decompress it first"
    if head[:1] in (b"{", b"["):
        return "it starts like JSON text"
    if size < BLOCK:
        return f"{size} bytes, less than one 512-byte tar header"
    return "no valid tar header at byte 0"


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _nts(field: bytes) -> str:
    """A NUL-terminated string field, as tarfile decodes it."""
    cut = field.find(b"\0")
    return (field if cut < 0 else field[:cut]).decode(ENCODING, "surrogateescape")


def _name(header: bytes) -> str:
    name = _nts(header[:100])
    prefix = _nts(header[345:500]) if header[345] else ""  # tarfile reads it in every format
    if prefix and header[156:157] not in (b"L", b"K", b"S"):
        name = f"{prefix}/{name}"
    return name


def _number(field: bytes, label: str, pos: int) -> int:
    """A size field: octal (or GNU's base-256 for big sizes), never negative."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        value = value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    else:
        try:
            # The usual "%011o\0" without decoding (int() takes bytes; a NUL inside is
            # a ValueError, and then the field is read as tarfile reads it).
            value = int(field[:-1], 8) if field[-1] in (0, 32) else -1
        except ValueError:
            value = -1
        if value < 0:
            try:
                value = int(_nts(field).strip() or "0", 8)
            except ValueError:
                value = -1
    if value < 0:
        raise InputError(f"{label}: damaged tar: bad size in the header at byte {pos}")
    return value


def _pax_size(text: str, label: str, pos: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"{label}: damaged tar: bad size in the pax header at byte {pos}")
    return value


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = int(_nts(header[148:156]).strip() or "-1", 8)
    except ValueError:
        return False
    # The sum of the header's bytes with the checksum field read as 8 spaces (unsigned, or
    # signed as some old tars wrote it).
    unsigned = sum(header) - sum(header[148:156]) + 256
    if stored == unsigned:
        return True
    signed = unsigned - 256 * sum(1 for b in header if b > 127)
    signed += 256 * sum(1 for b in header[148:156] if b > 127)
    return stored == signed


def _pax(body: bytes, label: str, pos: int) -> dict[str, str]:
    """The records of a pax header: ``"%d %s=%s\\n"`` (length, keyword, value)."""
    out: dict[str, str] = {}
    at = 0
    while at < len(body) and body[at] != 0:
        space = body.find(b" ", at)
        try:
            length = int(body[at:space])
        except ValueError:
            raise InputError(f"{label}: damaged tar: bad pax header at byte {pos}") from None
        record = body[space + 1 : at + length - 1]
        key, sep, value = record.partition(b"=")
        if length <= 0 or not sep or body[at + length - 1 : at + length] != b"\n":
            raise InputError(f"{label}: damaged tar: bad pax header at byte {pos}")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    if out.get("hdrcharset") == "BINARY":
        raise _UnsupportedError  # names in the file system's encoding: tarfile's rules
    return out


def _tarfile_members(path: str, label: str) -> Iterator[tuple[str, bytes]]:
    """The same members read with ``tarfile`` (the rare features)."""
    try:
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if member.issparse():
                    raise _sparse_error(label, member.name, member.offset)
                if member.isfile():
                    handle = tar.extractfile(member)
                    assert handle is not None
                    yield member.name, handle.read()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise InputError(f"{label}: damaged or truncated tar ({exc})") from exc
