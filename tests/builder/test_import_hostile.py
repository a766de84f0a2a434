"""Hostile import input: crafted files that once cost gigabytes, minutes, a SIGBUS or a
traceback are one :class:`InputError` naming the file and where in it."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
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


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _example(name: bytes, packed_int64s: bytes) -> bytes:
    """A ``tf.train.Example`` with one ``int64_list`` feature of the given packed run."""
    feature = _field(0x1A, _field(0x0A, packed_int64s))  # Feature.int64_list.value
    return _field(0x0A, _field(0x0A, _field(0x0A, name) + _field(0x12, feature)))


def _tfrecord(path: Path, records: list[bytes]) -> None:
    from shardstream.shard_builder.importers.tfrecord import masked_crc

    with open(path, "wb") as f:
        for data in records:
            head = len(data).to_bytes(8, "little")
            f.write(head + masked_crc(head).to_bytes(4, "little"))
            f.write(data + masked_crc(data).to_bytes(4, "little"))


LONG = 256 * 1024  # bytes of one varint: quadratic parsing took seconds (1 MB: 52-114 s)


@pytest.mark.timeout(120)  # a guard only: the assertions are on the error
@pytest.mark.parametrize(
    ("records", "bad"),
    [
        # An 11-byte varint in a packed int64 list (the old parser dropped the extra bits).
        ([_example(b"n", _varint(5)), _example(b"n", b"\xff" * 10 + b"\x01")], 1),
        # A varint as long as the record, as a tag: the general parser's first step.
        ([_example(b"n", _varint(5)), b"\xff" * LONG + b"\x01"], 1),
        # A second file whose first record is one long length varint: the layout of a
        # batch is read from it (tfrecord_layout) before the general parser names it.
        ([b"\x0a" + b"\xff" * LONG + b"\x01"], 0),
    ],
    ids=["11-bytes", "long-tag", "long-length-first-in-batch"],
)
def test_a_varint_longer_than_10_bytes_is_an_error_naming_file_and_record(
    tmp_path: Path, records: list[bytes], bad: int
) -> None:
    folder = tmp_path / "tfr"
    folder.mkdir()
    _tfrecord(folder / "a.tfrecord", [_example(b"n", _varint(i)) for i in range(3)])
    _tfrecord(folder / "b.tfrecord", records)
    pattern = rf"b\.tfrecord record {bad} \(byte \d+\): .*varint longer than 10 bytes"
    for workers in (1, 2):  # read, and read in batches by a worker process
        with pytest.raises(InputError, match=pattern):
            build_import(
                ImportConfig(
                    format="tfrecord",
                    inputs=(str(folder),),
                    output=str(tmp_path / f"out{workers}"),
                    **{**SMALL, "workers": workers},  # type: ignore[arg-type]
                )
            )


def _cli_import(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "shardstream", "import", *args, "--no-progress"]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)


def _one_error_line(run: subprocess.CompletedProcess[str], pattern: str) -> None:
    """The command failed with exit status 1 and one ``error:`` line matching ``pattern``
    (no traceback, no signal)."""
    assert run.returncode == 1, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert re.search(pattern, lines[0]), lines[0]


def _lmdb(folder: Path, entries: int = 2000) -> Path:
    import lmdb

    env = lmdb.open(str(folder), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(entries):
            txn.put(b"k%05d" % i, bytes([i % 256]) * 300)
    env.close()
    return folder / "data.mdb"


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_a_truncated_lmdb_file_is_one_error_not_a_sigbus(tmp_path: Path, keep: float) -> None:
    # LMDB maps the whole database and reads the pages its B-tree names: a page past the
    # end of a cut file was a SIGBUS that killed the import without a word.
    data = _lmdb(tmp_path / "db")
    cut = int(data.stat().st_size * keep)
    with open(data, "r+b") as f:
        f.truncate(cut)
    run = _cli_import("lmdb", str(tmp_path / "db"), "--output", str(tmp_path / "out"))
    _one_error_line(run, rf"data\.mdb: truncated LMDB database: {cut} bytes, .* needs \d+")
    assert not (tmp_path / "out" / "index.json").exists()


def _hf_folder(folder: Path) -> Path:
    """A ``save_to_disk`` folder of a small dataset; returns its Arrow file."""
    import datasets

    datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(10)]}).save_to_disk(folder)
    (arrow,) = folder.glob("*.arrow")
    return arrow


def _outside_copy(arrow: Path, tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere" / "private.arrow"
    outside.parent.mkdir()
    outside.write_bytes(arrow.read_bytes())
    return outside


def _point_state_at(folder: Path, filename: str) -> None:
    state = json.loads((folder / "state.json").read_text())
    state["_data_files"] = [{"filename": filename}]
    (folder / "state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("how", ["dot-dot", "absolute", "symlink"])
def test_hf_state_json_cannot_reach_outside_the_folder(tmp_path: Path, how: str) -> None:
    # A saved dataset names its own files: a folder from elsewhere must not make the import
    # read (and publish) another file of the user's.
    folder = tmp_path / "ds"
    arrow = _hf_folder(folder)
    outside = _outside_copy(arrow, tmp_path)
    if how == "dot-dot":
        _point_state_at(folder, "../elsewhere/private.arrow")
    elif how == "absolute":
        _point_state_at(folder, str(outside))
    else:
        arrow.unlink()
        arrow.symlink_to(outside)
    with pytest.raises(InputError, match=r"outside the source folder") as info:
        _import("hf", folder, tmp_path / "out")
    assert "private.arrow" in str(info.value) and str(folder) in str(info.value)


def test_a_dataset_dict_split_cannot_be_a_symlink_out(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "dd"
    data = datasets.Dataset.from_dict({"text": ["a", "b"]})
    datasets.DatasetDict({"train": data}).save_to_disk(folder)
    (folder / "train").rename(tmp_path / "moved")
    (folder / "train").symlink_to(tmp_path / "moved")
    with pytest.raises(InputError, match=r"outside the source folder"):
        _import("hf", folder, tmp_path / "out")


def test_a_litdata_chunk_cannot_be_a_symlink_out(tmp_path: Path) -> None:
    from litdata import optimize

    folder = tmp_path / "lit"
    optimize(fn=_lit_item, inputs=list(range(20)), output_dir=str(folder), chunk_size=5,
             num_workers=1, verbose=False)  # fmt: skip
    chunk = sorted(folder.glob("*.bin"))[1]
    moved = tmp_path / "elsewhere.bin"
    chunk.rename(moved)
    chunk.symlink_to(moved)
    with pytest.raises(InputError, match=rf"{chunk.name}.*outside the source folder"):
        _import("litdata", folder, tmp_path / "out")


def _lit_item(i: int) -> dict[str, object]:
    return {"id": i, "name": f"item {i}"}


def test_files_found_in_a_folder_cannot_be_symlinks_out(tmp_path: Path) -> None:
    # A folder walk takes what the folder holds, not what it points at; a file named on the
    # command line is the user's own choice and is read wherever it is.
    elsewhere = tmp_path / "elsewhere.tar"
    elsewhere.write_bytes(_plain_member("a.txt", b"secret") + b"\0" * 1024)
    folder = tmp_path / "wds"
    folder.mkdir()
    (folder / "shard-0.tar").symlink_to(elsewhere)
    with pytest.raises(InputError, match=r"shard-0\.tar.*outside the source folder"):
        _import("webdataset", folder, tmp_path / "out")
    _import("webdataset", folder / "shard-0.tar", tmp_path / "named")


def _hf_dict(tmp_path: Path) -> Path:
    import datasets

    folder = tmp_path / "dd"
    data = datasets.Dataset.from_dict({"text": [f"row {i:03d}" for i in range(10)]})
    datasets.DatasetDict({"train": data}).save_to_disk(folder)
    return folder


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _hostile_dataset_dict(text: str) -> object:
    def make(tmp_path: Path) -> tuple[str, Path, str]:
        folder = _hf_dict(tmp_path)
        _write_text(folder / "dataset_dict.json", text)
        return "hf", folder, r"dataset_dict\.json: "

    return make


def _hostile_state(text: str) -> object:
    def make(tmp_path: Path) -> tuple[str, Path, str]:
        folder = _hf_dict(tmp_path)
        _write_text(folder / "train" / "state.json", text)
        return "hf", folder, r"train/state\.json: "

    return make


def _bad_arrow_offsets(tmp_path: Path) -> tuple[str, Path, str]:
    # A string column whose offsets point past the data: pyarrow reads past its buffer
    # (a SystemError, or worse) unless the batch is validated before a value is taken.
    folder = _hf_dict(tmp_path)
    (arrow,) = (folder / "train").glob("*.arrow")
    data = bytearray(arrow.read_bytes())
    at = data.find(struct.pack("<4i", 0, 7, 14, 21))
    data[at + 8 : at + 12] = struct.pack("<i", 1 << 30)
    arrow.write_bytes(bytes(data))
    return "hf", folder, r"\.arrow row 0: damaged Arrow/Parquet file .*out of bounds"


def _damaged_parquet_text(tmp_path: Path) -> tuple[str, Path, str]:
    # pyarrow's messages end in (or hold) newlines: quoted as they were, the error took
    # several lines.
    from tests.builder.conftest import make_docs, write_parquet

    path = write_parquet(tmp_path / "a.parquet", make_docs(30))
    data = bytearray(path.read_bytes())
    data[-20:-8] = b"\xff" * 12  # inside the footer's thrift metadata
    path.write_bytes(bytes(data))
    return "text", path, r"a\.parquet: not a readable Parquet file"


def _litdata_config(tmp_path: Path) -> tuple[str, Path, str]:
    # A config LitData itself has to read (compressed chunks), with a value it refuses:
    # LitData reads index.json only when the dataset's length is first asked for.
    from litdata import optimize

    folder = tmp_path / "lit"
    optimize(fn=_lit_item, inputs=list(range(20)), output_dir=str(folder), chunk_size=5,
             num_workers=1, verbose=False)  # fmt: skip
    index = json.loads((folder / "index.json").read_text())
    index["config"]["compression_level"] = "../x"
    index["config"]["compression"] = "zstd"
    (folder / "index.json").write_text(json.dumps(index))
    return "litdata", folder, r"lit/index\.json: LitData cannot open the dataset"


def _litdata_count(value: int) -> object:
    def make(tmp_path: Path) -> tuple[str, Path, str]:
        from litdata import optimize

        folder = tmp_path / "lit"
        optimize(fn=_lit_item, inputs=list(range(10)), output_dir=str(folder), chunk_size=5,
                 num_workers=1, verbose=False)  # fmt: skip
        index = json.loads((folder / "index.json").read_text())
        index["chunks"][1]["chunk_size"] = value
        (folder / "index.json").write_text(json.dumps(index))
        return "litdata", folder, r"lit/index\.json: "

    return make


DEEP_JSON = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _deep_json_member(tmp_path: Path) -> tuple[str, Path, str]:
    tar = tmp_path / "deep.tar"
    members = [_plain_member("k1.json", b'{"a": 1}'), _plain_member("k2.json", DEEP_JSON)]
    tar.write_bytes(b"".join(members) + b"\0" * 1024)
    return "webdataset", tar, r"deep\.tar key k2\.json: cannot read the json member"


def _deep_json_value(tmp_path: Path) -> tuple[str, Path, str]:
    import lmdb

    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"k1", b'{"a": 1}')
        txn.put(b"k2", DEEP_JSON)
    env.close()
    return "lmdb-json", tmp_path / "db", r"db key b'k2': the value is not json"


def _hf_file_name(name: str) -> object:
    def make(tmp_path: Path) -> tuple[str, Path, str]:
        folder = tmp_path / "ds"
        _hf_folder(folder)
        _point_state_at(folder, name)
        return "hf", folder, r"ds: .* \(file named in state\.json\) is not a valid file name"

    return make


HOSTILE = {
    "dataset_dict-not-json": _hostile_dataset_dict("{not json"),
    "dataset_dict-a-string": _hostile_dataset_dict('"x"'),
    "dataset_dict-splits-a-number": _hostile_dataset_dict('{"splits": 0}'),
    "dataset_dict-splits-not-names": _hostile_dataset_dict('{"splits": [null]}'),
    "state-not-json": _hostile_state(""),
    "state-files-not-entries": _hostile_state('{"_data_files": [-1]}'),
    "arrow-offsets-out-of-bounds": _bad_arrow_offsets,
    "parquet-footer-garbled": _damaged_parquet_text,
    "litdata-config-refused": _litdata_config,
    "litdata-count-past-int64": _litdata_count(1 << 70),
    "litdata-count-negative": _litdata_count(-3),
    "webdataset-json-too-deep": _deep_json_member,
    "lmdb-json-too-deep": _deep_json_value,
    "state-file-name-lone-surrogate": _hf_file_name("\ud800.arrow"),
    "state-file-name-nul": _hf_file_name("a\0.arrow"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_one_error_line_naming_file_and_position(
    tmp_path: Path, case: str
) -> None:
    kind, source, pattern = HOSTILE[case](tmp_path)  # type: ignore[operator]
    if kind == "text":
        args = ["build", "text", str(source), "--seq-len", "16"]
    elif kind == "lmdb-json":
        args = ["import", "lmdb", str(source), "--value-format", "json"]
    else:
        args = ["import", kind, str(source)]
    command = [sys.executable, "-m", "shardstream", *args, "--output", str(tmp_path / "out")]
    run = subprocess.run(
        [*command, "--no-progress"], check=False, capture_output=True, text=True, timeout=300
    )
    _one_error_line(run, pattern)
    assert not (tmp_path / "out" / "index.json").exists()
