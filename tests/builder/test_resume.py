"""A build killed with SIGKILL and started again finishes exactly like an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardstream.shard_builder import ImageBuildConfig, TextBuildConfig, build_images, build_text
from shardstream.shard_builder.images import ImageKind
from shardstream.shard_builder.pipeline import BuildKind, BuildRun, produce_locally, run_build
from shardstream.shard_builder.text import TextKind
from shardstream.storage import open_store
from tests.builder.conftest import dir_bytes, jpeg_bytes, make_docs, read_with_ours, write_jsonl
from tests.fixtures.build_runs import build_cli, kill_when_journaled
from tests.fixtures.s3 import S3Bucket


@pytest.mark.slow
def test_text_build_killed_and_rerun_matches_a_clean_build(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    docs = make_docs(12_000, seed=21, max_words=120)
    write_jsonl(tmp_path / "a.jsonl", docs[:6000])
    write_jsonl(tmp_path / "b.jsonl", docs[6000:])
    out = tmp_path / "out"
    args = build_cli(
        "text", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"),
        "--output", str(out), "--tokenizer", str(tokenizer_file), "--seq-len", "64",
        "--shard-size", "8KB", "--allow-small-shards", "--chunk-bytes", "64KB",
        "--workers", "2",
    )  # fmt: skip
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    killed_after = kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=20)
    assert not (out / "index.json").exists()  # a killed build never looks complete

    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "reused" in rerun.stderr

    reference = build_text(
        TextBuildConfig(
            output=str(tmp_path / "ref"),
            inputs=(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")),
            tokenizer=tokenizer_file,
            seq_len=64,
            shard_size=8192,
            allow_small_shards=True,
            workers=1,
            progress=False,
        )
    )
    assert len(reference.shards) > killed_after + 5  # the kill really was mid-way
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")  # no duplicate, no missing sample


@pytest.mark.slow
def test_image_build_killed_and_rerun_matches_a_clean_build(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for label in range(4):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(150):
            (root / f"class{label}" / f"{i:04d}.jpg").write_bytes(
                jpeg_bytes(label * 1000 + i, (64, 48))
            )
    out = tmp_path / "out"
    args = build_cli(
        "images", str(root), "--output", str(out), "--shard-size", "16KB",
        "--allow-small-shards", "--workers", "2",
    )  # fmt: skip
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=5)
    assert not (out / "index.json").exists()
    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr

    reference = build_images(
        ImageBuildConfig(
            output=str(tmp_path / "ref"),
            inputs=(str(root),),
            shard_size=16 << 10,
            allow_small_shards=True,
            workers=1,
            progress=False,
        )
    )
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")
    labels = [s["label"] for s in read_with_ours(out)]
    assert labels == sorted(labels) and len(labels) == 600 == reference.samples


@pytest.mark.slow
def test_s3_build_killed_and_rerun_matches_a_clean_build(
    tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    docs = make_docs(8000, seed=23, max_words=120)
    write_jsonl(tmp_path / "d.jsonl", docs)
    url = f"{s3_bucket.url}/corpus"
    args = build_cli(
        "text", str(tmp_path / "d.jsonl"), "--output", url, "--seq-len", "64",
        "--shard-size", "32KB", "--allow-small-shards", "--chunk-bytes", "64KB",
        "--workers", "2",
    )  # fmt: skip
    client = s3_bucket.client()

    def journaled() -> int:
        page = client.list_objects_v2(
            Bucket=s3_bucket.name, Prefix="corpus/.shardstream-build/done/"
        )
        return int(page.get("KeyCount", 0))

    # The subprocess inherits the AWS_* settings that point at the moto server.
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while journaled() < 10:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    store = open_store(url)
    assert store.size("index.json") is None

    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "reused" in rerun.stderr
    build_text(
        TextBuildConfig(
            output=str(tmp_path / "ref"),
            inputs=(str(tmp_path / "d.jsonl"),),
            seq_len=64,
            shard_size=32768,
            allow_small_shards=True,
            workers=1,
            progress=False,
        )
    )
    reference = dir_bytes(tmp_path / "ref")
    stored = {key: store.read_bytes(key) for key, _ in store.list()}
    assert stored == reference  # journal gone, every shard identical, nothing extra


class _DriverKilled(Exception):
    """Stands for the SIGKILL of a Ray driver: the build stops with its journal in place."""


def _left_behind_by_a_cluster(run: Callable[[], object], out: Path, gap: range) -> list[str]:
    """The output of a cluster build whose driver died: journal entries and shards from 0 on,
    but none at the ``gap`` positions (their workers had not finished; Ray workers journal a
    shard, with the same entry the local builder writes, before putting it under its name,
    in any order). Returns the names of the shards past the gap."""
    with pytest.raises(_DriverKilled):
        run()
    done = out / ".shardstream-build" / "done"
    shards = sorted(out.glob("shard.*.mds"))
    assert len(shards) > gap.stop + 2 and not (out / "index.json").exists()
    for position in gap:
        (out / f"shard.{position:05d}.mds").unlink()
        (done / f"shard.{position:05d}.mds.json").unlink()
    return [p.name for p in shards[gap.stop :]]


def _killed_after_every_shard(kind: BuildKind, run: BuildRun) -> None:
    produce_locally(kind, run)
    raise _DriverKilled


def _files(out: Path, names: list[str]) -> dict[str, tuple[int, int]]:
    return {n: ((out / n).stat().st_ino, (out / n).stat().st_mtime_ns) for n in names}


def test_local_rerun_takes_a_cluster_builds_shards_past_the_journals_gap(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    # A Ray build killed mid-way, then re-run without --ray: the shards past the gap in its
    # journal are taken as they are (same file), not written again, as a Ray re-run does.
    docs = make_docs(3000, seed=5, max_words=80)
    write_jsonl(tmp_path / "a.jsonl", docs)
    out = tmp_path / "out"

    def config(output: Path) -> TextBuildConfig:
        return TextBuildConfig(
            output=str(output), inputs=(str(tmp_path / "a.jsonl"),), tokenizer=tokenizer_file,
            seq_len=64, shard_size=8192, allow_small_shards=True, chunk_bytes=32 << 10,
            workers=1, progress=False,
        )  # fmt: skip

    later = _left_behind_by_a_cluster(
        lambda: run_build(TextKind(config(out)), _killed_after_every_shard), out, range(2, 4)
    )
    before = _files(out, later)

    result = build_text(config(out))
    assert _files(out, later) == before  # not one of them written again
    assert result.reused_shards == 2 + len(later)
    build_text(config(tmp_path / "ref"))
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")


def test_local_image_rerun_takes_a_cluster_builds_shards_past_the_journals_gap(
    tmp_path: Path,
) -> None:
    root = tmp_path / "images"
    for label in range(2):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(60):
            (root / f"class{label}" / f"{i:04d}.jpg").write_bytes(jpeg_bytes(label * 100 + i))
    out = tmp_path / "out"

    def config(output: Path) -> ImageBuildConfig:
        return ImageBuildConfig(
            output=str(output), inputs=(str(root),), shard_size=8 << 10,
            allow_small_shards=True, workers=1, progress=False,
        )  # fmt: skip

    later = _left_behind_by_a_cluster(
        lambda: run_build(ImageKind(config(out)), _killed_after_every_shard), out, range(1, 2)
    )
    before = _files(out, later)

    result = build_images(config(out))
    assert _files(out, later) == before
    assert result.reused_shards == 1 + len(later)
    build_images(config(tmp_path / "ref"))
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")
