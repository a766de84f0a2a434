"""Shards of an import are written by a writer thread, one in flight: its output and
journal are those of a write in line, and its failure fails the import cleanly."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from shardstream.errors import InputError
from shardstream.mds import write_samples
from shardstream.shard_builder.importers import ImportConfig, build, build_import
from tests.builder.conftest import dir_bytes, write_lmdb

SMALL = {"shard_size": 6 * 1024, "allow_small_shards": True, "progress": False}


def _source(root: Path) -> str:
    return write_lmdb(root, 900, base=40, spread=120)


def _writers() -> list[str]:
    return [t.name for t in threading.enumerate() if "import-writer" in t.name]


def test_a_failing_shard_write_fails_the_import_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fail_the_fifth(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        if len(calls) == 5:
            raise InputError("disk on fire")
        return write_samples(*args, **kwargs)

    monkeypatch.setattr(build, "write_samples", fail_the_fifth)
    out = tmp_path / "out"
    config = ImportConfig(format="lmdb", inputs=(_source(tmp_path),), output=str(out), **SMALL)
    with pytest.raises(InputError, match="disk on fire"):
        build_import(config)
    assert not (out / "index.json").exists()
    assert all("import-writer" in name for name in calls)  # written off the main thread
    assert not _writers()


def test_resumed_after_a_failed_write_the_output_is_a_clean_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(tmp_path)
    calls = []

    def fail_the_ninth(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 9:
            raise KeyboardInterrupt  # like a kill: the journal keeps what was stored
        return write_samples(*args, **kwargs)

    out, clean = tmp_path / "out", tmp_path / "clean"
    with monkeypatch.context() as patch:
        patch.setattr(build, "write_samples", fail_the_ninth)
        with pytest.raises(KeyboardInterrupt):
            build_import(ImportConfig(format="lmdb", inputs=(source,), output=str(out), **SMALL))
    resumed = build_import(ImportConfig(format="lmdb", inputs=(source,), output=str(out), **SMALL))
    build_import(ImportConfig(format="lmdb", inputs=(source,), output=str(clean), **SMALL))
    assert resumed.reused_shards == 8  # shards 0-7 stored; the 9th write failed
    assert dir_bytes(out) == dir_bytes(clean)
    assert not _writers()
