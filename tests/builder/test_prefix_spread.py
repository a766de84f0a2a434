"""``--spread-prefixes``: shards under hashed folders, published through a real server into
moto's S3, read by our client (by name, through the server) and by MosaicML's
``streaming.StreamingDataset``, with the same samples as a build without the option."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import numpy as np
import pytest
import streaming
from PIL import Image

from shardstream.api_client import APIClient
from shardstream.cli import main
from shardstream.client import CacheOptions, PlanOptions, ServerOptions, StreamingDataset
from shardstream.errors import ConfigError
from shardstream.mds import load_index, write_shard
from shardstream.shard_builder import ImageBuildConfig, TextBuildConfig, build_images, build_text
from shardstream.storage import open_store
from tests.builder.conftest import (
    dir_bytes,
    make_docs,
    read_with_ours,
    read_with_streaming,
    write_jsonl,
)
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer

SPREAD_KEY = re.compile(r"([0-9a-f]{4})/shard\.\d{5}\.mds")
SMALL = ("--seq-len", "16", "--shard-size", "4KB", "--allow-small-shards", "--no-progress")


def _config(corpus: Path, output: str, *, spread: bool) -> TextBuildConfig:
    return TextBuildConfig(
        output=output,
        inputs=(str(corpus),),
        seq_len=16,
        shard_size=4096,
        allow_small_shards=True,
        workers=1,
        progress=False,
        spread_prefixes=spread,
    )


def _rows(samples: list[dict[str, object]]) -> list[tuple[int, ...]]:
    return [tuple(np.asarray(s["tokens"]).tolist()) for s in samples]


def test_spread_build_published_to_s3_reads_the_same_everywhere(
    tmp_path: Path,
    s3_bucket: S3Bucket,
    live_server: LiveServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = write_jsonl(tmp_path / "d.jsonl", make_docs(300, seed=3))
    plain = build_text(_config(corpus, str(tmp_path / "plain"), spread=False))
    expected = _rows(read_with_ours(tmp_path / "plain"))
    assert len(plain.index.shards) >= 8

    url = f"{s3_bucket.url}/spread"
    server = ["--server", live_server.url, "--token", live_server.token, "--dataset", "spread"]
    argv = ["build", "text", str(corpus), *SMALL, "--spread-prefixes", "-o", url, *server]
    assert main(argv) == 0

    # Every shard sits under a 4-hex folder, over several folders; nothing at the top level.
    keys = sorted(key for key, _ in open_store(url).list())
    shard_keys = [k for k in keys if k not in ("index.json", "shardstream.json")]
    assert len(shard_keys) == len(plain.index.shards)
    prefixes = {m.group(1) for k in shard_keys if (m := SPREAD_KEY.fullmatch(k))}
    assert len(prefixes) >= 2 and all(SPREAD_KEY.fullmatch(k) for k in shard_keys)
    index = load_index(open_store(url).read_bytes("index.json"))
    in_order = [s.raw_data.basename for s in index.shards]
    assert sorted(in_order) == shard_keys
    # Only the names differ from the plain build: the shard bytes are the same.
    for spread, flat in zip(index.shards, plain.index.shards, strict=True):
        assert spread.raw_data.basename.endswith("/" + flat.raw_data.basename)
        assert spread.raw_data.hashes == flat.raw_data.hashes

    with APIClient(live_server.url, live_server.token) as api:
        version = api.latest_version("spread")
        assert version.status == "published" and version.total_samples == len(expected)
        assert [s.key for s in api.iter_shards("spread", version.number)] == in_order

    # Our client, by dataset name: the server hands out the spread keys.
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    assert len(expected) % 4 == 0  # batches of 4: the "drop" tail policy drops nothing
    ours = StreamingDataset(
        "spread",
        4,
        server=ServerOptions(url=live_server.url),
        cache=CacheOptions(dir=tmp_path / "cache"),
        plan=dataclasses.replace(PlanOptions(), shuffle=False),
    )
    got = [tuple(row) for batch in ours for row in np.asarray(batch["tokens"]).tolist()]
    assert sorted(got) == sorted(expected)

    # MosaicML's reader, straight from S3, in index order.
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_bucket.endpoint_url)
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    theirs = streaming.StreamingDataset(
        remote=url, local=str(tmp_path / "mosaic"), shuffle=False, batch_size=1
    )
    assert _rows([theirs[i] for i in range(len(theirs))]) == expected


def test_spread_local_build_writes_sub_folders(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "d.jsonl", make_docs(200, seed=8))
    build_text(_config(corpus, str(tmp_path / "plain"), spread=False))
    result = build_text(_config(corpus, str(tmp_path / "out"), spread=True))
    files = dir_bytes(tmp_path / "out")
    shard_files = sorted(f for f in files if f not in ("index.json", "shardstream.json"))
    assert shard_files == sorted(s.raw_data.basename for s in result.index.shards)
    assert all(SPREAD_KEY.fullmatch(f) for f in shard_files)
    assert len({f.split("/")[0] for f in shard_files}) >= 2
    expected = _rows(read_with_ours(tmp_path / "plain"))
    assert _rows(read_with_ours(tmp_path / "out")) == expected
    # The same command again finds the finished spread dataset and reuses it.
    rerun = build_text(_config(corpus, str(tmp_path / "out"), spread=True))
    assert rerun.reused_shards == len(result.index.shards)

    # --overwrite replaces a spread dataset (its folders' shards are recognised as ours).
    again = _config(corpus, str(tmp_path / "out"), spread=False)
    build_text(dataclasses.replace(again, overwrite=True))
    assert not [name for name in dir_bytes(tmp_path / "out") if "/" in name]
    assert _rows(read_with_ours(tmp_path / "out")) == expected


def test_spread_image_build_with_zstd(tmp_path: Path, image_folder: Path) -> None:
    def config(out: str, spread: bool) -> ImageBuildConfig:
        return ImageBuildConfig(
            output=str(tmp_path / out),
            inputs=(str(image_folder),),
            compression="zstd",
            shard_size=8192,
            allow_small_shards=True,
            workers=1,
            progress=False,
            spread_prefixes=spread,
        )

    plain = build_images(config("plain", False))
    spread = build_images(config("out", True))
    zipped = [s.zip_data.basename for s in spread.index.shards if s.zip_data is not None]
    assert len(zipped) == len(plain.index.shards) >= 2
    assert all(re.fullmatch(r"[0-9a-f]{4}/shard\.\d{5}\.mds\.zstd", z) for z in zipped)
    assert all((tmp_path / "out" / z).is_file() for z in zipped)

    def pixels(image: object) -> bytes:
        """Decoded pixels: MosaicML decodes JPEG columns, our reader gives the bytes."""
        if not isinstance(image, Image.Image):
            image = Image.open(io.BytesIO(image))  # type: ignore[arg-type]
        return image.tobytes()

    expected = [(pixels(s["image"]), s["label"]) for s in read_with_ours(tmp_path / "plain")]
    theirs = read_with_streaming(tmp_path / "out", tmp_path / "mcache")
    assert [(pixels(s["image"]), int(s["label"])) for s in theirs] == expected  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "basename", ["../shard.00000.mds", "ab//shard.00000.mds", "./shard.00000.mds", "ab/.x.mds"]
)
def test_codec_refuses_unsafe_shard_keys(tmp_path: Path, basename: str) -> None:
    with pytest.raises(ConfigError, match="shard basename"):
        write_shard(tmp_path / "ds", basename, {"id": "int"}, [b"\0" * 8])
    assert not (tmp_path / "shard.00000.mds").exists()


def test_codec_writes_a_shard_under_a_sub_folder(tmp_path: Path) -> None:
    info = write_shard(tmp_path, "1f0c/shard.00000.mds", {"id": "int"}, [b"\1" * 8])
    assert info.raw_data.basename == "1f0c/shard.00000.mds"
    assert (tmp_path / "1f0c" / "shard.00000.mds").stat().st_size == info.raw_data.bytes
    assert not list((tmp_path / "1f0c").glob(".*"))  # no temp file left beside it


def test_server_accepts_spread_keys_and_still_refuses_traversal() -> None:
    from shardstream.server.storage.locations import check_shard_key

    assert check_shard_key("ab12/shard.00001.mds") is None
    assert check_shard_key("ab12/shard.00001.mds.zstd") is None
    for bad in ("ab12/../shard.00001.mds", "ab12//shard.00001.mds", "/ab12/shard.00001.mds"):
        assert check_shard_key(bad) is not None


@pytest.mark.slow
def test_spread_build_killed_and_rerun_matches_a_clean_build(tmp_path: Path) -> None:
    """The journal finds shards in their hashed folders; temp files there are swept."""
    import subprocess

    from tests.fixtures.build_runs import build_cli, kill_when_journaled

    corpus = write_jsonl(tmp_path / "d.jsonl", make_docs(12_000, seed=21, max_words=120))
    out = tmp_path / "out"
    args = build_cli(
        "text", str(corpus), "--output", str(out), "--seq-len", "64", "--shard-size", "8KB",
        "--allow-small-shards", "--chunk-bytes", "64KB", "--workers", "2", "--spread-prefixes",
    )  # fmt: skip
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    killed_after = kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=20)
    assert not (out / "index.json").exists()
    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "reused" in rerun.stderr

    config = dataclasses.replace(
        _config(corpus, str(tmp_path / "ref"), spread=True), seq_len=64, shard_size=8192
    )
    reference = build_text(config)
    assert len(reference.shards) > killed_after + 5  # the kill really was mid-way
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")  # no temp file, no duplicate
