"""Shards of an import are written by writer threads, several in flight with many workers:
the output and journal are those of a write in line, and a failure fails the import
cleanly."""

from __future__ import annotations

import threading
import time
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


def test_shards_are_written_several_at_once_to_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, lock = _source(tmp_path), threading.Lock()
    now, most = [0], [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.02)  # long enough for the next shards to be handed out meanwhile
            return write_samples(*args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    outputs = {}
    for workers in (1, 2, 8):
        most[0] = 0
        out = tmp_path / f"out-{workers}"
        with monkeypatch.context() as patch:
            patch.setattr(build, "write_samples", counted)
            config = ImportConfig(
                format="lmdb", inputs=(source,), output=str(out), workers=workers, **SMALL
            )
            build_import(config)
        assert most[0] == build.writer_threads(workers), workers
        outputs[workers] = dir_bytes(out)
    assert [build.writer_threads(w) for w in (1, 2, 8, 64)] == [2, 2, 4, 4]
    assert outputs[1] == outputs[2] == outputs[8]
    assert not _writers()


@pytest.mark.parametrize("workers", [2, 8])
def test_a_failing_shard_write_fails_the_import_and_publishes_nothing(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def fail_the_fifth(*args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        if args[1] == "shard.00004.mds":  # the fifth (by name: writers run at once)
            raise InputError("disk on fire")
        return write_samples(*args, **kwargs)

    monkeypatch.setattr(build, "write_samples", fail_the_fifth)
    out = tmp_path / "out"
    config = ImportConfig(
        format="lmdb", inputs=(_source(tmp_path),), output=str(out), workers=workers, **SMALL
    )
    with pytest.raises(InputError, match="disk on fire"):
        build_import(config)
    assert not (out / "index.json").exists()
    assert all("import-writer" in name for name in calls)  # written off the main thread
    assert not _writers()


@pytest.mark.parametrize("workers", [2, 8])
def test_resumed_after_a_failed_write_the_output_is_a_clean_import(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(tmp_path)
    calls = []

    def fail_the_ninth(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if args[1] == "shard.00008.mds":  # the ninth
            raise KeyboardInterrupt  # like a kill: the journal keeps what was stored
        return write_samples(*args, **kwargs)

    out, clean = tmp_path / "out", tmp_path / "clean"
    with monkeypatch.context() as patch:
        patch.setattr(build, "write_samples", fail_the_ninth)
        with pytest.raises(KeyboardInterrupt):
            build_import(
                ImportConfig(
                    format="lmdb", inputs=(source,), output=str(out), workers=workers, **SMALL
                )
            )
    resumed = build_import(ImportConfig(format="lmdb", inputs=(source,), output=str(out), **SMALL))
    build_import(ImportConfig(format="lmdb", inputs=(source,), output=str(clean), **SMALL))
    # Shards 0-7 stored; the 9th write failed (later ones in flight are not journaled).
    assert resumed.reused_shards == 8
    assert dir_bytes(out) == dir_bytes(clean)
    assert not _writers()
