"""Sources and transport: local paths, s3:// through moto, server-named datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, ReadOptions, ServerOptions, Source, StreamingDataset
from shardstream.client.sources.source import resolve_source, split_index_url
from shardstream.errors import ConfigError, HashMismatchError, NotFoundError
from shardstream.shard_builder.publish import register_index
from shardstream.storage import open_store
from tests.fixtures.datasets import ids_of, token_row, write_tokens
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.server import LiveServer

N = 120


def upload(folder: Path, url: str) -> None:
    store = open_store(url)
    for path in sorted(folder.iterdir()):
        store.upload(path, path.name)


def read_all(ds: StreamingDataset) -> list[int]:
    ids: list[int] = []
    for batch in ds:
        for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
            assert row.numpy().tolist() == token_row(i).tolist()
        ids += ids_of(batch)
    return ids


def test_split_index_url() -> None:
    assert split_index_url("s3://b/p/index.json") == ("s3://b/p", "index.json")
    assert split_index_url("s3://b/p/") == ("s3://b/p", "index.json")
    assert split_index_url("index.json") == (".", "index.json")


def test_local_folder_index_and_file_url_are_one_version(tmp_path: Path) -> None:
    write_tokens(tmp_path / "ds", N, size_limit=600)
    forms = [str(tmp_path / "ds"), str(tmp_path / "ds" / "index.json"), (tmp_path / "ds").as_uri()]
    versions = {resolve_source(Source(form)).version_id for form in forms}
    assert len(versions) == 1
    ds = StreamingDataset(forms[2], 4, cache=CacheOptions(dir=tmp_path / "c"))
    assert sorted(read_all(ds)) == list(range(N))


def test_missing_index_names_the_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no index\.json at .*nothing-here"):
        StreamingDataset(str(tmp_path / "nothing-here"), 4)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_s3_source_through_cache(
    s3_bucket: S3Bucket, tmp_path: Path, compression: str | None
) -> None:
    write_tokens(tmp_path / "ds", N, size_limit=600, compression=compression)
    upload(tmp_path / "ds", f"{s3_bucket.url}/tokens")
    cache, read = CacheOptions(dir=tmp_path / "cache"), ReadOptions(download_threads=3)
    ds = StreamingDataset(f"{s3_bucket.url}/tokens/index.json", 4, cache=cache, read=read)
    assert sorted(read_all(ds)) == list(range(N))
    cached = list((tmp_path / "cache").rglob("*.mds"))
    assert len(cached) == len(ds.resolved[0].shards)  # stored uncompressed, once each
    # Warm cache: the shards are not read from the bucket again.
    store = open_store(f"{s3_bucket.url}/tokens")
    for key, _ in list(store.list()):
        if key != "index.json":
            store.delete(key)
    again = StreamingDataset(f"{s3_bucket.url}/tokens/index.json", 4, cache=cache)
    assert sorted(read_all(again)) == list(range(N))


def test_corrupt_object_is_refused(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    write_tokens(tmp_path / "ds", N, size_limit=600)
    shard = sorted((tmp_path / "ds").glob("*.mds"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    upload(tmp_path / "ds", f"{s3_bucket.url}/bad")
    ds = StreamingDataset(
        f"{s3_bucket.url}/bad/index.json", 4, cache=CacheOptions(dir=tmp_path / "cache")
    )
    with pytest.raises(HashMismatchError, match=shard.name):
        read_all(ds)


def test_server_named_source_and_checkpoints(
    live_server: LiveServer, s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tokens(tmp_path / "ds", N, size_limit=600, compression="zstd")
    upload(tmp_path / "ds", f"{s3_bucket.url}/named")
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient(live_server.url) as api:
        register_index(api, f"{s3_bucket.url}/named/index.json", "tokens")
        run = api.create_run([("tokens", 1)], global_batch_size=4)
    server = ServerOptions(url=live_server.url, run=run.id)
    cache = CacheOptions(dir=tmp_path / "cache")
    for uri in ("tokens", "tokens@1", "tokens@latest"):
        ds = StreamingDataset(uri, 4, server=server, cache=cache)
        assert ds.stream.versions == ("tokens@1",)
    ds = StreamingDataset("tokens@1", 4, server=server, cache=CacheOptions(dir=tmp_path / "c2"))
    assert sorted(read_all(ds)) == list(range(N))

    from shardstream.client import ShardstreamLoader

    loader = ShardstreamLoader(ds, num_workers=1)
    it = iter(loader)
    head = [ids_of(next(it)) for _ in range(7)]
    loader.commit(7)
    loader.commit(7)  # the same state again is a no-op
    rest = [ids_of(b) for b in it]
    loader.close()
    for resume in ("latest", 7):
        again = ShardstreamLoader(ds, num_workers=1, resume=resume)
        assert [ids_of(b) for b in again] == rest
        again.close()
    assert head and rest
    with pytest.raises(NotFoundError):
        StreamingDataset("tokens@9", 4, server=server, cache=cache)


def test_server_named_source_in_a_local_folder(
    live_server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that keeps shards in a local folder (the laptop default) is read directly."""
    write_tokens(tmp_path / "ds", N, size_limit=600)
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient(live_server.url) as api:
        register_index(api, str(tmp_path / "ds" / "index.json"), "local-tokens")
    ds = StreamingDataset(
        "local-tokens",
        4,
        server=ServerOptions(url=live_server.url),
        cache=CacheOptions(dir=tmp_path / "cache"),
    )
    assert ds.stream.versions == ("local-tokens@1",)
    assert sorted(read_all(ds)) == list(range(N))
