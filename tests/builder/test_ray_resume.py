"""Ray builds killed mid-way (the driver, or a whole worker node) and run again.

The re-run reuses every shard the killed run had journaled and tokenizes only the chunks
from the one the journal stops in; the output is byte-identical to an uninterrupted local
build; with ``--dataset`` nothing is published until the re-run finishes, and a failed
build leaves an aborted draft.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardstream.api_client import APIClient
from shardstream.shard_builder import TextBuildConfig, build_text
from shardstream.shard_builder.inputs import resolve_inputs
from shardstream.shard_builder.text_source import plan_chunks
from shardstream.storage import ObjectStore, open_store
from tests.builder.conftest import dir_bytes, make_docs, write_jsonl
from tests.fixtures.build_runs import CHUNK, REPO, ray_build_cli, rerun_build, run_build_until
from tests.fixtures.ray_cluster import RayCluster
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import start_server

# Starts Ray: runs only in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.ray

SMALL = ["--seq-len", "64", "--shard-size", "8KB", "--allow-small-shards", "--no-progress"]


def _journal(url: str) -> list[dict[str, object]]:
    """The journaled shards of the build at ``url``, the longest prefix 0, 1, 2, ..."""
    store = open_store(url)
    entries = {
        key.rsplit("/", 1)[1]: json.loads(store.read_bytes(key))
        for key, _ in store.list(".shardstream-build/done")
    }
    prefix = []
    while (name := f"shard.{len(prefix):05d}.mds.json") in entries:
        prefix.append(entries[name])
    return prefix


def _stored_prefix(url: str) -> list[dict[str, object]]:
    """The journal's prefix whose shards are stored whole: where a re-run resumes. A
    worker journals a shard before putting it in place, so a kill between the two leaves
    an entry (maybe the prefix's last) that the re-run cannot vouch for and writes again."""
    store, prefix = open_store(url), []
    for entry in _journal(url):
        if not _stored_whole(store, entry):
            break
        prefix.append(entry)
    return prefix


def _stored_entries(url: str) -> int:
    """Journal entries (any position) whose shard is stored whole: what a re-run reuses."""
    store = open_store(url)
    entries = (json.loads(store.read_bytes(k)) for k, _ in store.list(".shardstream-build/done"))
    return sum(_stored_whole(store, entry) for entry in entries)


def _stored_whole(store: ObjectStore, entry: dict[str, Any]) -> bool:
    """Whether the shard of journal ``entry`` is in ``store`` at its recorded size."""
    info = entry["info"]
    stored = info.get("zip_data") or info["raw_data"]  # the file as stored
    return bool(store.size(stored["basename"]) == stored["bytes"])


def _lose_worker_node_midway(
    args: list[str], url: str, cwd: Path, cluster: RayCluster, timeout: float
) -> tuple[int, str]:
    """Run the build until 15 shards are journaled, kill the cluster's second node (its
    raylet and workers, as a lost machine), and return the build's exit code and stderr
    once it ends; the node is started again either way."""
    proc = run_build_until(args, lambda: len(_journal(url)) >= 15, cwd)
    try:
        cluster.kill_worker_node()
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.start_worker_node()
    return proc.returncode, err.decode()


def _tokenized_chunks(stderr: str) -> int:
    """Chunks tokenized by the run, from its per-worker summary lines."""
    counts = re.findall(r"^worker .*\((\d+) chunks\)", stderr, re.MULTILINE)
    assert len(counts) == 2, stderr
    return sum(map(int, counts))


def _reference(tmp_path: Path, inputs: list[Path], tokenizer: Path | None) -> dict[str, bytes]:
    build_text(
        TextBuildConfig(
            output=str(tmp_path / "ref"),
            inputs=tuple(map(str, inputs)),
            tokenizer=tokenizer,
            seq_len=64,
            shard_size=8192,
            allow_small_shards=True,
            chunk_bytes=CHUNK,
            workers=1,
            progress=False,
        )
    )
    return dir_bytes(tmp_path / "ref")


@pytest.mark.slow
def test_driver_killed_then_rerun_publishes_once_reusing_finished_shards(
    tmp_path: Path,
    tokenizer_file: Path,
    s3_bucket: S3Bucket,
    postgres_url: str,
    ray_cluster: RayCluster,
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(9000, seed=41, max_words=120))
    chunks = len(plan_chunks(resolve_inputs([str(corpus)], (".jsonl",)), "text", CHUNK))
    with start_server(
        tmp_path / "server", database_url=postgres_url, storage_root=f"{s3_bucket.url}/datasets"
    ) as server:
        api = APIClient(server.url, server.token)
        args = ray_build_cli(
            "text", str(corpus), "--tokenizer", str(tokenizer_file), *SMALL,
            "--ray", ray_cluster.address,
            "--server", server.url, "--token", server.token, "--dataset", "corpus",
        )  # fmt: skip

        def journaled(shards: int) -> Callable[[], bool]:
            def check() -> bool:
                try:
                    root = api.get_version("corpus", 1).storage_root
                except Exception:
                    return False  # no draft yet
                return len(_journal(root)) >= shards

            return check

        proc = run_build_until(args, journaled(15), tmp_path)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        ray_cluster.wait_idle()  # the job's workers are gone: the journal stays as it is

        # Killed: a draft, nothing published, no index in storage.
        draft = api.get_version("corpus", 1)
        assert draft.status == "draft" and draft.num_shards == 0
        assert api.get_dataset("corpus").latest_published is None
        store = open_store(draft.storage_root)
        assert store.size("index.json") is None
        journal = _stored_prefix(draft.storage_root)
        resume_chunk = journal[-1]["resume"]["stream"]["chunk"]  # type: ignore[index]

        reusable = _stored_entries(draft.storage_root)
        rerun = rerun_build(args, tmp_path)
        assert "published corpus version 1" in rerun.stderr  # the same draft, continued
        assert f"{reusable} shards reused" in rerun.stderr
        # Only the chunks from the one the journal stopped in are tokenized again.
        assert _tokenized_chunks(rerun.stderr) == chunks - resume_chunk < chunks
        version = api.get_version("corpus", 1)
        assert version.status == "published"
        stored = {key: store.read_bytes(key) for key, _ in store.list()}
        assert stored == _reference(tmp_path, [corpus], tokenizer_file)
        assert version.num_shards == len([k for k in stored if k.startswith("shard.")])
        api.close()


@pytest.mark.slow
def test_driver_killed_then_rerun_rewrites_no_finished_shard(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    # Workers finish shards out of order and ahead of the driver; each journals its shard
    # before putting it in place. Whatever the driver had taken in when it was killed,
    # every shard in the output is reused as it is: same file (inode), never written again.
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(6000, seed=45, max_words=120))
    out = tmp_path / "out"
    args = ray_build_cli(
        "text", str(corpus), *SMALL, "--ray", ray_cluster.address, "--output", str(out)
    )
    proc = run_build_until(args, lambda: len(list(out.glob("shard.*.mds"))) >= 14, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    ray_cluster.wait_idle()  # the job's workers are gone: nothing writes into the output
    finished = {
        path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in out.glob("shard.*.mds")
    }
    assert len(finished) >= 14 and not (out / "index.json").exists()

    rerun = rerun_build(args, tmp_path)
    assert f"{len(finished)} shards reused" in rerun.stderr
    again = {
        name: ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) for name in finished
    }
    assert sorted(n for n in finished if again[n] != finished[n]) == []  # none written again
    assert dir_bytes(out) == _reference(tmp_path, [corpus], None)


@pytest.mark.slow
def test_worker_node_lost_fails_clearly_then_rerun_resumes(
    tmp_path: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(6000, seed=42, max_words=120))
    url = f"{s3_bucket.url}/corpus"
    args = ray_build_cli("text", str(corpus), *SMALL, "--ray", ray_cluster.address, "--output", url)
    args += ["--ray-retries", "0"]  # stop at the loss (the default resumes by itself)
    returncode, message = _lose_worker_node_midway(args, url, tmp_path, ray_cluster, 180)
    assert returncode == 1, message
    assert "shardstream: error: a Ray worker or its node was lost" in message
    assert "run the same command again to resume" in message
    assert "Traceback" not in message
    ray_cluster.wait_idle()
    reusable = _stored_entries(url)
    assert open_store(url).size("index.json") is None

    rerun = rerun_build(args, tmp_path)
    assert f"{reusable} shards reused" in rerun.stderr
    store = open_store(url)
    stored = {key: store.read_bytes(key) for key, _ in store.list()}
    assert stored == _reference(tmp_path, [corpus], None)


@pytest.mark.slow
def test_worker_node_lost_build_resumes_by_itself_on_the_nodes_left(
    tmp_path: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(6000, seed=44, max_words=120))
    url = f"{s3_bucket.url}/corpus"
    args = ray_build_cli("text", str(corpus), *SMALL, "--ray", ray_cluster.address, "--output", url)
    returncode, message = _lose_worker_node_midway(args, url, tmp_path, ray_cluster, 240)
    assert returncode == 0, message
    assert "a Ray worker or its node was lost" in message
    assert "resuming from the journal (attempt 2 of 3)" in message
    # The retry waits until Ray has declared the node dead, so no worker of attempt 2 is
    # placed on it: one node lost, one retry spent.
    assert "attempt 3 of 3" not in message
    assert "only 1 of 2 Ray workers started" not in message, message  # none on the dead node
    assert "Ray declared the lost node(s) dead" in message
    assert "shards reused from an earlier run" in message
    store = open_store(url)
    stored = {key: store.read_bytes(key) for key, _ in store.list()}
    assert stored == _reference(tmp_path, [corpus], None)


def test_failed_ray_build_leaves_an_aborted_draft_and_one_clear_error(
    tmp_path: Path, s3_bucket: S3Bucket, postgres_url: str, ray_cluster: RayCluster
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(600, seed=43))
    with corpus.open("a") as fh:
        fh.write('{"text": 5}\n')
    with start_server(
        tmp_path / "server", database_url=postgres_url, storage_root=f"{s3_bucket.url}/datasets"
    ) as server:
        args = ray_build_cli(
            "text", str(corpus), *SMALL, "--ray", ray_cluster.address,
            "--server", server.url, "--token", server.token, "--dataset", "broken",
        )  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 1
        assert "shardstream: error:" in done.stderr
        assert "corpus.jsonl:601: field 'text' is int, not a string" in done.stderr
        assert "Traceback" not in done.stderr
        with APIClient(server.url, server.token) as api:
            assert api.get_version("broken", 1).status == "aborted"
            assert api.get_dataset("broken").latest_published is None
