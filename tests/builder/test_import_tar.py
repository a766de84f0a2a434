"""Reading tars from their headers (``importers/tar.py``) gives what ``tarfile`` gives, and
damage is one error naming the file and the member."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.shard_builder.importers import tar as tar_module
from shardstream.shard_builder.importers.tar import tar_members
from tests.builder.conftest import read_with_ours

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
_SEGMENT = st.text(st.sampled_from("abcxyz019_-é"), min_size=1, max_size=40)
_MEMBER = st.tuples(
    st.lists(_SEGMENT, min_size=1, max_size=5).map("/".join),
    st.sampled_from(["file", "file", "file", "dir", "symlink", "link"]),
    st.binary(max_size=1300),
)


def _write(path: Path, members: list[tuple[str, str, bytes]], fmt: int, **kwargs: object) -> None:
    with tarfile.open(path, "w", format=fmt, **kwargs) as tar:  # type: ignore[call-overload]
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000.5  # a float mtime: a pax header per member, as wds writes
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}.get(
                kind, tarfile.LNKTYPE
            )
            info.linkname = "target"
            tar.addfile(info)


def _theirs(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path, "r|") as tar:
        out = []
        for member in tar:
            if member.isfile():
                handle = tar.extractfile(member)
                assert handle is not None
                out.append((member.name, handle.read()))
        return out


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(members=st.lists(_MEMBER, max_size=8), fmt=st.sampled_from(sorted(FORMATS)))
def test_members_are_what_tarfile_reads(
    members: list[tuple[str, str, bytes]], fmt: str, tmp_path: Path
) -> None:
    path = tmp_path / f"{fmt}.tar"
    try:
        _write(path, members, FORMATS[fmt])
    except ValueError:
        return  # a name the format cannot hold (ustar: over 255 characters)
    assert list(tar_members(str(path), "x")) == _theirs(path)


def test_long_names_in_every_format(tmp_path: Path) -> None:
    long = "d" * 120 + "/" + "n" * 150 + ".seg.jpg"
    split = "p" * 150 + "/" + "short.txt"  # ustar: prefix + name
    for fmt in ("gnu", "pax"):
        path = tmp_path / f"{fmt}.tar"
        _write(path, [(long, "file", b"abc"), ("b.txt", "file", b"")], FORMATS[fmt])
        assert list(tar_members(str(path), "x")) == [(long, b"abc"), ("b.txt", b"")]
    _write(tmp_path / "ustar.tar", [(split, "file", b"q" * 512)], tarfile.USTAR_FORMAT)
    assert list(tar_members(str(tmp_path / "ustar.tar"), "x")) == [(split, b"q" * 512)]


def test_a_global_header_that_sets_a_path_is_read_by_tarfile(tmp_path: Path) -> None:
    members = [("a.txt", "file", b"1"), ("b.txt", "file", b"22")]
    _write(tmp_path / "g.tar", members, tarfile.PAX_FORMAT, pax_headers={"comment": "hi"})
    assert list(tar_members(str(tmp_path / "g.tar"), "x")) == _theirs(tmp_path / "g.tar")
    _write(tmp_path / "p.tar", members, tarfile.PAX_FORMAT, pax_headers={"path": "all.txt"})
    assert list(tar_members(str(tmp_path / "p.tar"), "x")) == _theirs(tmp_path / "p.tar")


def test_rare_features_go_to_tarfile_after_the_members_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    members = [(f"m{i}.bin", "file", bytes([i]) * (i * 100)) for i in range(6)]
    _write(tmp_path / "t.tar", members, tarfile.PAX_FORMAT)
    walk = tar_module._walk

    def unsupported_after_three(*args: object) -> object:
        for n, member in enumerate(walk(*args)):  # type: ignore[arg-type]
            if n == 3:
                raise tar_module._UnsupportedError
            yield member

    monkeypatch.setattr(tar_module, "_walk", unsupported_after_three)
    assert list(tar_members(str(tmp_path / "t.tar"), "x")) == _theirs(tmp_path / "t.tar")


def _cut(tmp_path: Path, keep: int) -> str:
    members = [(f"s{i:03d}.{x}", "file", bytes([i]) * 700) for i in range(4) for x in ("a", "b")]
    _write(tmp_path / "t.tar", members, tarfile.PAX_FORMAT)
    data = (tmp_path / "t.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[:keep] if keep >= 0 else data[: len(data) + keep])
    return str(tmp_path / "cut.tar")


def test_a_tar_cut_inside_a_member_names_file_and_member(tmp_path: Path) -> None:
    # Each member: pax header (512 + 512), ustar header (512), 700 bytes in 1024.
    path = _cut(tmp_path, 3 * 2560 + 1536 + 100)
    with pytest.raises(InputError, match=r"cut\.tar: truncated tar: member 's001\.b'.*needs 700"):
        list(tar_members(path, path))


def test_a_tar_cut_at_a_header_or_without_its_end_block_is_an_error(tmp_path: Path) -> None:
    path = _cut(tmp_path, 5 * 2560)  # at a member's boundary: tarfile stops without a word
    assert len(_theirs(Path(path))) == 5
    with pytest.raises(InputError, match=r"cut\.tar: truncated tar after member 's002\.a'"):
        list(tar_members(path, path))
    path = _cut(tmp_path, 5 * 2560 + 300)  # inside a header
    with pytest.raises(InputError, match=r"truncated tar after member 's002\.a' \(byte 12800"):
        list(tar_members(path, path))


def test_a_damaged_header_is_an_error_not_the_end(tmp_path: Path) -> None:
    path = _cut(tmp_path, -1)
    data = bytearray(Path(path).read_bytes())
    data[2 * 2560 + 1024 + 5] ^= 0xFF  # s001.a's name
    Path(path).write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"bad header checksum after member 's000\.b'"):
        list(tar_members(path, path))
    Path(path).write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        list(tar_members(path, path))


def test_webdataset_import_of_long_keys_and_of_a_cut_shard(tmp_path: Path) -> None:
    keys = ["k" * 90 + f"/{'deep/' * 30}s{i:03d}" for i in range(30)]  # names over 255 bytes
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=100, verbose=0) as sink:
        for i, key in enumerate(keys):
            sink.write({"__key__": key, "cls": i, "txt": f"caption {i}"})
    source = str(folder / "shard-000000.tar")
    options: dict[str, Any] = {
        "format": "webdataset",
        "shard_size": 4096,
        "allow_small_shards": True,
        "progress": False,
    }
    build_import(ImportConfig(inputs=(source,), output=str(tmp_path / "out"), **options))
    got = read_with_ours(tmp_path / "out")
    assert [(s["cls"], s["txt"]) for s in got] == [(i, f"caption {i}") for i in range(30)]

    data = Path(source).read_bytes()
    Path(source).write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"shard-000000\.tar: truncated tar.*member '.*/s01\d\."):
        build_import(ImportConfig(inputs=(source,), output=str(tmp_path / "cut"), **options))
    assert not (tmp_path / "cut" / "index.json").exists()


def test_a_negative_size_is_an_error_not_a_step_back(tmp_path: Path) -> None:
    path = Path(_cut(tmp_path, -1))
    data = bytearray(path.read_bytes())
    header = data[2560 + 1024 : 2560 + 1536]  # s000.b's ustar header
    header[124:136] = b"\xff" * 12  # base-256 for -1
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[2560 + 1024 : 2560 + 1536] = header
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"cut\.tar: damaged tar: bad size .* byte 3584"):
        list(tar_members(str(path), str(path)))
