"""Hostile import input: crafted files that once cost gigabytes, minutes, a SIGBUS or a
traceback are one :class:`InputError` naming the file and where in it."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import

SMALL = {"shard_size": 16 * 1024, "allow_small_shards": True, "progress": False, "workers": 1}


def _import(fmt: str, source: Path, out: Path, **kw: object) -> None:
    build_import(
        ImportConfig(format=fmt, inputs=(str(source),), output=str(out), **SMALL, **kw)  # type: ignore[arg-type]
    )


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _gnu_sparse_member(name: str, data: bytes, declared: int) -> bytes:
    """An old-GNU sparse member (type ``S``): ``data`` at offset 0, the rest of the
    ``declared`` size a hole (what ``tar --sparse`` writes for a mostly empty file)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[156:157] = b"S"
    header[386:398] = _octal(0, 12)  # the one stored run: offset 0 ...
    header[398:410] = _octal(len(data), 12)  # ... of len(data) bytes
    header[482] = 0  # no extension blocks
    header[483:495] = _octal(declared, 12)  # the size the member claims
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + data + b"\0" * (-len(data) % 512)


def _pax_sparse_member(name: str, data: bytes, declared: int) -> bytes:
    """A pax 1.0 sparse member (``GNU.sparse.*`` keys; the map leads the data)."""
    body = b"1\n0\n%d\n" % len(data)
    body += b"\0" * (-len(body) % 512) + data
    info = tarfile.TarInfo(f"GNUSparseFile.0/{name}")
    info.size = len(body)
    info.pax_headers = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(declared),
    }
    return info.tobuf(format=tarfile.PAX_FORMAT) + body + b"\0" * (-len(body) % 512)


def _plain_member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info.tobuf(format=tarfile.GNU_FORMAT) + data + b"\0" * (-len(data) % 512)


@pytest.mark.parametrize("member", [_gnu_sparse_member, _pax_sparse_member])
def test_a_sparse_member_is_refused_before_anything_is_allocated(
    tmp_path: Path, member: object
) -> None:
    # 64 MiB declared in a file of a few KB: the old reader filled the hole with zeros
    # (1 GiB declared cost 3.2 GiB of memory); now nothing past the file's bytes is read.
    tar = tmp_path / "wds" / "shard-000000.tar"
    tar.parent.mkdir()
    first = _plain_member("a.txt", b"first sample")
    sparse = member("b.bin", b"x" * 600, 64 << 20)  # type: ignore[operator]
    tar.write_bytes(first + sparse + b"\0" * 1024)
    assert tar.stat().st_size < 8192
    with pytest.raises(InputError, match=r"shard-000000\.tar: member 'b\.bin'.*sparse") as info:
        _import("webdataset", tar, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "index.json").exists()
