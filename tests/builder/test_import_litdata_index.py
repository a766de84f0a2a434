"""A LitData ``index.json`` of many chunks: read in time and memory that scale, with a
progress bar, and still confined to its folder.

An index of 1,000,000 chunks ran past 180 s, 65 of every 78 s in resolving each chunk's
path to check it stays inside the folder, and ``json.loads`` held a dict per chunk (six
times the file's size). The folder is now listed once and only symlinks are resolved, and
the chunk list is parsed an entry at a time.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import InputError
from shardstream.shard_builder.importers import json_stream, litdata_index
from shardstream.shard_builder.importers.json_stream import load_streaming
from shardstream.shard_builder.importers.litdata_index import read_index
from shardstream.shard_builder.progress import planning_progress

CONFIG = {
    "chunk_bytes": None, "chunk_size": 5, "compression": None, "data_format": ["int"],
    "data_spec": '[1, {"type": null, "context": null, "children_spec": []}]',
    "encryption": None, "item_loader": "PyTreeLoader",
}  # fmt: skip


def _index(folder: Path, chunks: int, name: str = "chunk-0-{}.bin") -> Path:
    """An ``index.json`` of ``chunks`` entries (LitData's layout; the chunk files are not
    written: planning reads the index alone)."""
    folder.mkdir(exist_ok=True)
    entries = [
        {"chunk_bytes": 100, "chunk_size": 5, "dim": None, "filename": name.format(i)}
        for i in range(chunks)
    ]
    meta = {"chunks": entries, "config": CONFIG, "updated_at": "1700000000.5"}
    (folder / "index.json").write_text(json.dumps(meta, sort_keys=True))
    return folder


def _count_realpath(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.path.realpath`` resolves from now on (it still resolves them)."""
    calls: list[str] = []
    real = os.path.realpath

    def counted(path: Any, *args: Any, **kw: Any) -> str:
        calls.append(str(path))
        return str(real(path, *args, **kw))

    monkeypatch.setattr(os.path, "realpath", counted)
    return calls


def test_a_big_index_resolves_only_its_symlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _index(tmp_path / "lit", 20_000)
    (folder / "chunk-0-7.bin").write_bytes(b"x")
    (folder / "chunk-0-9.bin").symlink_to(folder / "chunk-0-7.bin")  # a link inside: fine
    calls = _count_realpath(monkeypatch)
    index = read_index(str(folder))
    assert len(index.names) == 20_000 and int(index.items.sum()) == 100_000
    # The old check resolved every chunk (20,000 paths and the folder with each).
    assert sorted(Path(c).name for c in calls) == ["chunk-0-9.bin", "lit"]


def test_a_symlink_out_among_many_chunks_is_refused_naming_it(tmp_path: Path) -> None:
    folder = _index(tmp_path / "lit", 20_000)
    (tmp_path / "secret.bin").write_bytes(b"private")
    (folder / "chunk-0-12345.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(InputError, match=r"chunk-0-12345\.bin: this LitData chunk resolves to "):
        read_index(str(folder))


@pytest.mark.parametrize("name", ["../x{}.bin", "sub/c{}.bin", "..", "a\0{}.bin", "\ud800{}"])
def test_a_chunk_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "lit"
    _index(folder, 3)
    meta = json.loads((folder / "index.json").read_text())
    meta["chunks"][1]["filename"] = name.format(1)
    (folder / "index.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=r"lit: not a LitData optimized folder .*plain file name"):
        read_index(str(folder))


def test_a_big_index_is_read_within_four_times_its_size(tmp_path: Path) -> None:
    # json.loads held a dict per chunk: 6.1x the file's size at its peak.
    folder = _index(tmp_path / "lit", 10_000)
    size = (folder / "index.json").stat().st_size
    tracemalloc.start()
    try:
        read_index(str(folder))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * size, (peak, size)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_big_index_shows_a_progress_bar_while_planning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    enabled: bool,
) -> None:
    folder = _index(tmp_path / "lit", 5_000)
    monkeypatch.setattr(litdata_index, "BIG_INDEX", 1 << 18)  # 420 KB of index: a big one
    with planning_progress(enabled):
        read_index(str(folder))
    err = capsys.readouterr().err
    assert ("read index.json" in err) is enabled
    small = _index(tmp_path / "small", 10)
    with planning_progress(True):
        read_index(str(small))
    assert "read index.json" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"chunks": [1, 2', "Expecting ','|Expecting value|Expecting ']'"),
        ('{"chunks": [], "chunks": []}', "appears twice"),
        ('{"chunks": {}}', r"Expecting '\['"),
        ('{"chunks": []} x', "the end of the text"),
        ("[]", r"Expecting '\{'"),
        ('{"a": 1,}', "property name"),
    ],
)
def test_a_damaged_chunk_list_is_a_value_error_with_its_position(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        load_streaming(text, "chunks", lambda items: None)


def test_streaming_reads_what_json_loads_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "BATCH_ITEMS", 64)
    meta = {"b": [1, {"x": [2, 3]}], "chunks": [{"n": i} for i in range(1000)], "z": None}
    for text in (
        json.dumps(meta),
        json.dumps(meta, indent=2),
        json.dumps(meta, separators=(",", ":")),
    ):
        got: list[Any] = []
        rest = load_streaming(text, "chunks", got.extend)
        assert got == meta["chunks"] and rest == {**meta, "chunks": None}
