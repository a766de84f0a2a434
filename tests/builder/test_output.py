"""Output to S3 (moto's server on loopback) and the ``shardstream build`` command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardstream.cli import main
from shardstream.mds import ShardReader, load_index
from shardstream.shard_builder import TextBuildConfig, build_text
from shardstream.storage import open_store
from tests.builder.conftest import (
    dir_bytes,
    encode_reference,
    make_docs,
    read_with_ours,
    write_jsonl,
)
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer


def test_text_build_to_s3(tmp_path: Path, s3_bucket: S3Bucket, tokenizer_file: Path) -> None:
    docs = make_docs(400, seed=4)
    write_jsonl(tmp_path / "d.jsonl", docs)
    url = f"{s3_bucket.url}/corpus/v1"
    result = build_text(
        TextBuildConfig(
            output=url,
            inputs=(str(tmp_path / "d.jsonl"),),
            tokenizer=tokenizer_file,
            seq_len=32,
            shard_size=4096,
            allow_small_shards=True,
            workers=2,
            progress=False,
        )
    )
    assert result.output == url
    store = open_store(url)
    keys = {key for key, _ in store.list()}
    shard_names = {s.raw_data.basename for s in result.shards}
    assert keys == shard_names | {"index.json", "shardstream.json"}  # no journal, no temp
    index = load_index(store.read_bytes("index.json"))
    assert index.to_json() == result.index.to_json()
    assert json.loads(store.read_bytes("shardstream.json"))["documents"] == 400

    tokens = []
    for shard in index.shards:
        local = tmp_path / "dl" / shard.raw_data.basename
        local.parent.mkdir(exist_ok=True)
        store.download(
            shard.raw_data.basename,
            local,
            expected_size=shard.raw_data.bytes,
            expected_hashes=shard.raw_data.hashes,
        )
        reader = ShardReader(local, shard)
        tokens.append(reader.gather("tokens", np.arange(len(reader))).reshape(-1))
    got = np.concatenate(tokens).astype(np.int64)
    np.testing.assert_array_equal(got, encode_reference(tokenizer_file, docs)[: len(got)])

    # The same build written locally is byte-identical to what went to S3.
    local_result = build_text(
        TextBuildConfig(
            output=str(tmp_path / "local"),
            inputs=(str(tmp_path / "d.jsonl"),),
            tokenizer=tokenizer_file,
            seq_len=32,
            shard_size=4096,
            allow_small_shards=True,
            workers=1,
            progress=False,
        )
    )
    assert local_result.index.to_json() == result.index.to_json()
    local = dir_bytes(tmp_path / "local")
    assert all(store.read_bytes(name) == local[name] for name in local)


def test_cli_text_and_images(
    tmp_path: Path, image_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = make_docs(200, seed=6)
    write_jsonl(tmp_path / "d.jsonl", docs, field="content")
    rc = main(
        [
            "build", "text", str(tmp_path / "d.jsonl"), "--field", "content",
            "--seq-len", "16", "-o", str(tmp_path / "text"), "--shard-size", "2KB",
            "--allow-small-shards", "--workers", "1", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    assert "dropped at the end" in capsys.readouterr().err
    samples = read_with_ours(tmp_path / "text")
    got = np.concatenate([s["tokens"] for s in samples]).astype(np.int64)  # type: ignore[misc]
    np.testing.assert_array_equal(got, encode_reference(None, docs)[: len(got)])

    rc = main(
        [
            "build", "images", str(image_folder), "-o", str(tmp_path / "img"),
            "--shard-size", "16KB", "--allow-small-shards", "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    meta = json.loads((tmp_path / "img" / "shardstream.json").read_text())
    assert meta["label_names"] == ["cat", "dog", "zebra"]

    # Errors come out as one line and exit status 1, not a traceback.
    rc = main(["build", "text", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "x")])
    assert rc == 1
    assert "nope.jsonl: no such file" in capsys.readouterr().err
    rc = main(["build", "text", str(tmp_path / "d.jsonl"), "-o", "x", "--shard-size", "1MB"])
    assert rc == 1
    assert "outside the accepted range 64-256 MB" in capsys.readouterr().err


def test_cli_build_publishes_to_the_server(
    tmp_path: Path, live_server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from shardstream.api_client import APIClient

    write_jsonl(tmp_path / "d.jsonl", make_docs(300, seed=9))
    server = ["--server", live_server.url, "--token", live_server.token, "--dataset", "wiki"]
    small = ["--seq-len", "16", "--shard-size", "4KB", "--allow-small-shards", "--no-progress"]
    # No --output: the shards go to the storage root the server gives the new version.
    assert main(["build", "text", str(tmp_path / "d.jsonl"), *small, *server]) == 0
    assert "published wiki version 1" in capsys.readouterr().err
    with APIClient(live_server.url, live_server.token) as api:
        version = api.get_version("wiki", 1)
        assert version.status == "published"
        root = Path(version.storage_root.removeprefix("file://"))
        index = load_index(root / "index.json")
        assert [s.key for s in api.iter_shards("wiki", 1)] == [
            s.raw_data.basename for s in index.shards
        ]
        assert version.total_samples == index.num_samples > 0

        # A build that fails leaves an aborted draft, never a published version.
        (tmp_path / "bad.jsonl").write_text("{not json\n")
        assert main(["build", "text", str(tmp_path / "bad.jsonl"), *small, *server]) == 1
        assert "bad.jsonl:1: invalid JSON" in capsys.readouterr().err
        assert api.get_version("wiki", 2).status == "aborted"
        assert api.latest_version("wiki").number == 1


def test_cli_build_to_output_names_only_where_the_shards_are(
    tmp_path: Path, live_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(200, seed=4))
    out = tmp_path / "elsewhere"
    server = ["--server", live_server.url, "--token", live_server.token, "--dataset", "out"]
    small = ["--seq-len", "16", "--shard-size", "4KB", "--allow-small-shards", "--no-progress"]
    with caplog.at_level("INFO", logger="shardstream"):
        assert main(["build", "text", str(tmp_path / "d.jsonl"), *small, *server,
                     "--output", str(out)]) == 0  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if "draft out v1" in r.getMessage()]
    assert lines == [
        "opened draft out v1",
        f"draft out v1: {len(load_index(out / 'index.json').shards)} shards at file://{out}",
    ]
