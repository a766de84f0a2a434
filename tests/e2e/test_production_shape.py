"""The production shape on one machine (issue 5 §3), end to end.

* the metadata server on PostgreSQL, moto's S3 server as the object store;
* ``shardstream build text ... --server URL --dataset NAME`` (the real CLI, a subprocess)
  tokenizes a corpus into S3 and publishes it through the server;
* a 2-rank gloo job with 2 loader workers per rank reads the dataset *by name*: shard URLs
  are presigned by the server (the ranks get no AWS credentials at all), through a node
  cache whose limit is smaller than the dataset;
* the job commits its loader state to the server at every checkpoint, is SIGKILLed
  mid-epoch (every rank and worker), restarts with ``resume="latest"``, and the consumed
  sequence is compared with an uninterrupted run, and every sample's tokens with the
  published shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from shardstream.api_client import APIClient
from shardstream.mds import ShardReader, decompress_shard, load_index
from shardstream.storage import open_store
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import start_server
from tests.harness.compare import check_same_world_resume
from tests.harness.config import DataSettings, ServerResume, TrainerConfig
from tests.harness.job import REPO_ROOT
from tests.harness.scenario import attempt, run_and_kill, run_epoch

# Starts torch.distributed: runs in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.distributed

DATASET = "e2e-corpus"
SEQ_LEN = 32  # byte-level tokens per sample: 64 bytes as uint16
SHARD_SIZE = 16 << 10
GLOBAL_BATCH = 32
PARTITIONS = 4
CKPT_EVERY = 10
# The ranks must not be able to reach the bucket themselves: presigned URLs only.
AWS_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _write_corpus(path: Path, docs: int = 1500) -> None:
    """Deterministic English-like documents of varied length (about 0.3 MB)."""
    rng = np.random.default_rng(5)
    words = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was"]
    with path.open("w") as out:
        for d in range(docs):
            n = int(rng.integers(10, 60))
            text = f"doc {d}: " + " ".join(words[int(i)] for i in rng.integers(0, len(words), n))
            out.write(json.dumps({"text": text}) + "\n")


def _tokens_by_id(storage_root: str, work: Path) -> npt.NDArray[np.uint16]:
    """Every sample's tokens in global-id order, read straight from the published shards."""
    store = open_store(storage_root)
    index = load_index(store.read_bytes("index.json"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for info in index.shards:
        stored = work / info.stored.basename
        store.download(info.stored.basename, stored)
        raw = stored
        if info.zip_data is not None:
            raw = work / info.raw_data.basename
            decompress_shard(stored, raw, str(info.compression))
        reader = ShardReader(raw, info)
        rows.append(reader.gather("tokens", np.arange(len(reader))))
    return np.concatenate(rows)


@pytest.mark.slow
def test_build_publish_stream_kill_resume_on_postgres_and_s3(
    tmp_path: Path, s3_bucket: S3Bucket, postgres_url: str
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    _write_corpus(corpus)
    # The server decides where datasets live: under its S3 root, the builder writes there.
    with start_server(
        tmp_path / "server", database_url=postgres_url, storage_root=f"{s3_bucket.url}/datasets"
    ) as server:
        build = subprocess.run(
            [
                *(sys.executable, "-m", "shardstream", "build", "text", str(corpus)),
                *("--seq-len", str(SEQ_LEN)),
                *("--shard-size", str(SHARD_SIZE), "--allow-small-shards", "--workers", "1"),
                *("--no-progress", "--server", server.url, "--dataset", DATASET),
                *("--token", server.token),
            ],
            check=False,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert build.returncode == 0, build.stderr[-3000:]

        with APIClient(server.url, server.token) as api:
            version = api.latest_version(DATASET)
            run = api.create_run([(DATASET, version.number)], global_batch_size=GLOBAL_BATCH)
        assert version.status == "published"
        assert version.storage_root.startswith(f"{s3_bucket.url}/datasets/{DATASET}-")
        tokens = _tokens_by_id(version.storage_root, tmp_path / "check")
        assert len(tokens) == version.total_samples and version.num_shards >= 16
        np.save(tmp_path / "tokens.npy", tokens)
        steps = version.total_samples // GLOBAL_BATCH  # tail "drop"
        limit = version.total_raw_bytes * 6 // 10  # the cache holds 60% of the dataset

        data = DataSettings(
            source=DATASET,
            global_batch_size=GLOBAL_BATCH,
            num_partitions=PARTITIONS,
            seed=11,
            # A mixing window of ~1 shard per partition: the working set of 2 ranks x 2
            # partitions then fits the cache (the default window would pin every shard).
            window=256,
            server=server.url,
            run_id=str(run.id),
            cache_dir=str(tmp_path / "cache-ref"),
            cache_limit_bytes=limit,
            open_shards=2,
            prefetch_shards=1,
            expected_tokens=str(tmp_path / "tokens.npy"),
        )
        base = TrainerConfig(
            attempt_dir=str(tmp_path / "ref"),
            data=data,
            num_workers=2,
            checkpoint_every=CKPT_EVERY,
            step_sleep_s=0.02,
        )
        env = {"SHARDSTREAM_TOKEN": server.token}
        ref = run_epoch(
            attempt(base, "ref", step_sleep_s=0.0), 2, env=env, unset_env=AWS_CREDENTIALS
        )
        assert ref.last_common_step() == steps

        node_cache = dict(cache_dir=str(tmp_path / "cache"))
        # Every rank commits the same state at each checkpoint: concurrent identical
        # commits of one step must all succeed (PostgreSQL serializes them).
        job = attempt(
            base, "killed", commit=True, commit_all_ranks=True, data=_with(data, **node_cache)
        )
        killed = run_and_kill(job, 2, kill_at_step=steps // 2, env=env, unset_env=AWS_CREDENTIALS)
        with APIClient(server.url, server.token) as api:
            latest = api.latest_checkpoint(run.id)
        assert latest is not None and latest.step <= killed.checkpoint_step

        # Same node cache as the killed job: whatever the SIGKILL left there must not block.
        resumed = run_epoch(
            attempt(
                base,
                "resumed",
                commit=True,
                commit_all_ranks=True,
                resume_server=ServerResume("latest"),
                data=_with(data, **node_cache),
            ),
            2,
            env=env,
            unset_env=AWS_CREDENTIALS,
        )
    report = check_same_world_resume(ref, killed.log, resumed, latest.step, GLOBAL_BATCH)
    assert report.total_steps == steps
    cached = sum(p.stat().st_size for p in (tmp_path / "cache" / "data").rglob("*") if p.is_file())
    assert 0 < cached <= limit < version.total_raw_bytes


def _with(data: DataSettings, **changes: str) -> DataSettings:
    import dataclasses

    return dataclasses.replace(data, **changes)  # type: ignore[arg-type]
