"""``build text --documents`` on a real two-node Ray cluster (``ray_cluster``).

Every Ray document build is compared byte for byte with the local ``--documents`` build
of the same inputs and options (shards, ``index.json``, ``shardstream.json``), chat/SFT
records with their loss masks too; a build whose driver is killed resumes from its
journal, reusing every finished shard; inputs the Ray document build does not read are
refused with one clear error.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from shardstream.errors import ConfigError
from shardstream.shard_builder import TextBuildConfig, build_text
from shardstream.shard_builder.cluster import RayOptions, build_text_on_ray
from shardstream.shard_builder.inputs import resolve_inputs
from shardstream.shard_builder.text_source import plan_chunks
from tests.builder.conftest import dir_bytes, make_docs, read_with_ours, write_jsonl, write_parquet
from tests.fixtures.build_runs import ray_build_cli, rerun_build, run_build_until, stored_objects
from tests.fixtures.ray_cluster import RayCluster
from tests.fixtures.s3 import S3Bucket

# Starts Ray: runs only in a private network namespace (tests/fixtures/netns.py).
pytestmark = pytest.mark.ray

SMALL = {"shard_size": 8192, "allow_small_shards": True, "progress": False, "documents": True}
CHUNK = 32 << 10  # as test_ray_resume's ray_build_cli


def test_documents_on_two_nodes_are_byte_identical_to_the_local_build(
    tmp_path: Path, tokenizer_file: Path, s3_bucket: S3Bucket, ray_cluster: RayCluster
) -> None:
    docs = make_docs(3000, seed=51, max_words=120)
    write_jsonl(tmp_path / "a.jsonl", docs[:1800])
    write_parquet(tmp_path / "b.parquet", docs[1800:], row_group_size=300)
    options = {
        "inputs": (str(tmp_path / "a.jsonl"), str(tmp_path / "b.parquet")),
        "tokenizer": tokenizer_file,
        "chunk_bytes": 32 << 10,
        **SMALL,
    }
    local = build_text(TextBuildConfig(output=str(tmp_path / "local"), workers=1, **options))
    url = f"{s3_bucket.url}/documents"
    result = build_text_on_ray(
        TextBuildConfig(output=url, **options), RayOptions(address=ray_cluster.address)
    )
    assert stored_objects(url) == dir_bytes(
        tmp_path / "local"
    )  # shards, index.json, shardstream.json
    assert len(result.shards) == len(local.shards) > 20
    assert result.samples == result.documents == local.documents == len(docs)
    assert result.tokens == local.tokens
    assert result.columns == {"tokens": "ndarray:uint16"}
    # Both nodes worked: each actor encoded chunks and wrote shards.
    assert len({w.name.split(" pid ")[0] for w in result.workers}) == 2
    assert all(w.chunks > 0 and w.shards > 0 for w in result.workers)
    assert sum(w.items for w in result.workers) == len(docs)
    assert sum(w.shards for w in result.workers) == len(result.shards)


def test_chat_records_with_loss_masks_on_ray_match_the_local_build(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    pairs = [
        {"prompt": f"Q{i}: {'why? ' * (i % 7)}", "response": "answer " * (1 + i % 11)}
        for i in range(1500)
    ]
    with open(tmp_path / "chat.jsonl", "w") as fh:
        for pair in pairs:
            fh.write(json.dumps(pair) + "\n")
    options = {
        "inputs": (str(tmp_path / "chat.jsonl"),),
        "prompt_field": "prompt",
        "field": "response",
        "chunk_bytes": 8 << 10,
        **SMALL,
    }
    build_text(TextBuildConfig(output=str(tmp_path / "local"), workers=2, **options))
    for workers in (1, 2):
        build_text_on_ray(
            TextBuildConfig(output=str(tmp_path / f"ray{workers}"), **options),
            RayOptions(address=ray_cluster.address, workers=workers),
        )
    local = dir_bytes(tmp_path / "local")
    assert dir_bytes(tmp_path / "ray1") == dir_bytes(tmp_path / "ray2") == local
    samples = read_with_ours(tmp_path / "ray2")
    assert len(samples) == len(pairs) and len([k for k in local if k.startswith("shard.")]) > 10
    for pair, sample in zip(pairs, samples, strict=True):
        prompt, reply = list(pair["prompt"].encode()), [*pair["response"].encode(), 256]
        assert np.asarray(sample["tokens"]).tolist() == prompt + reply
        assert np.asarray(sample["loss_mask"]).tolist() == [0] * len(prompt) + [1] * len(reply)


def test_cli_documents_ray_flag_matches_the_local_build(
    tmp_path: Path, ray_cluster: RayCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstream.cli import main

    write_jsonl(tmp_path / "d.jsonl", make_docs(800, seed=52))
    common = ["build", "text", str(tmp_path / "d.jsonl"), "--documents", "--no-progress"]
    common += ["--shard-size", "4KB", "--allow-small-shards", "--chunk-bytes", "8KB"]
    common += ["--compression", "zstd", "--spread-prefixes"]  # written as the workers write
    assert main([*common, "-o", str(tmp_path / "local"), "--workers", "1"]) == 0
    capsys.readouterr()
    assert main([*common, "-o", str(tmp_path / "ray"), "--ray", ray_cluster.address]) == 0
    err = capsys.readouterr().err
    assert dir_bytes(tmp_path / "ray") == dir_bytes(tmp_path / "local")
    assert list((tmp_path / "ray").glob("*/shard.*.mds.zstd"))
    workers = [line for line in err.splitlines() if line.startswith("worker 127.0.0.2 node")]
    assert len(workers) == 2, err
    assert "800 samples" in err, err


@pytest.mark.slow
def test_documents_driver_killed_then_rerun_reuses_finished_shards(
    tmp_path: Path, ray_cluster: RayCluster
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", make_docs(6000, seed=53, max_words=120))
    chunks = len(plan_chunks(resolve_inputs([str(corpus)], (".jsonl",)), "text", CHUNK))
    out = tmp_path / "out"
    args = ray_build_cli(
        "text", str(corpus), "--documents", "--shard-size", "8KB", "--allow-small-shards",
        "--no-progress", "--ray", ray_cluster.address, "--output", str(out),
    )  # fmt: skip
    proc = run_build_until(args, lambda: len(list(out.glob("shard.*.mds"))) >= 14, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    ray_cluster.wait_idle()  # the job's workers are gone: nothing writes into the output
    finished = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("shard.*.mds")}
    assert len(finished) >= 14 and not (out / "index.json").exists()

    rerun = rerun_build(args, tmp_path)
    assert f"{len(finished)} shards reused" in rerun.stderr
    again = {n: ((out / n).stat().st_ino, (out / n).stat().st_mtime_ns) for n in finished}
    assert sorted(n for n in finished if again[n] != finished[n]) == []  # none written again
    # Only the chunks from the one the unbroken journal stops in are encoded again.
    counts = re.findall(r"^worker .*\((\d+) chunks\)", rerun.stderr, re.MULTILINE)
    assert 0 < sum(map(int, counts)) < chunks, rerun.stderr
    reference = build_text(
        TextBuildConfig(
            output=str(tmp_path / "ref"), inputs=(str(corpus),), chunk_bytes=CHUNK, workers=1,
            **SMALL,
        )
    )  # fmt: skip
    assert len(reference.shards) > len(finished) + 5
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")


def test_documents_from_inputs_ray_does_not_read_is_one_clear_error(tmp_path: Path) -> None:
    # Refused before joining any cluster: s3:// inputs and Ray datasets are read by Ray
    # Data, which the document build does not take (the local build reads files only).
    config = TextBuildConfig(output=str(tmp_path / "o"), inputs=("s3://bucket/raw/",), **SMALL)
    with pytest.raises(ConfigError, match=r"--documents on Ray reads input files every node"):
        build_text_on_ray(config, RayOptions(address="127.0.0.1:1"))
    config = TextBuildConfig(output=str(tmp_path / "o"), inputs=("my-corpus",), **SMALL)
    with pytest.raises(ConfigError, match=r"s3:// inputs and Ray datasets"):
        build_text_on_ray(config, RayOptions(address="127.0.0.1:1"), dataset=object())
    assert not (tmp_path / "o").exists()
