"""Cache identity is content identity: a warm node never serves another dataset's bytes.

A dataset deleted and re-created under its name (new ``v1``, same shard sizes, other
bytes), another server, another bucket or folder: each is a different cache entry.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, ServerOptions, StreamingDataset
from shardstream.client.options import Source
from shardstream.client.sources.source import resolve_source
from shardstream.shard_builder.publish import register_index
from tests.fixtures.datasets import ids_of, token_row, write_tokens
from tests.fixtures.server import LiveServer

N = 120


def _read(name: str, url: str, token: str, cache: str, out: Any) -> None:
    ds = StreamingDataset(
        name, 4, server=ServerOptions(url=url, token=token), cache=CacheOptions(dir=Path(cache))
    )
    got: dict[int, list[int]] = {}
    for batch in ds:
        for i, row in zip(ids_of(batch), np.asarray(batch["tokens"]), strict=True):
            got[i] = row.tolist()
    out.put((got, [ds.resolved[0].cache_key(s) for s in range(len(ds.resolved[0].shards))]))


def read_on_node(server: LiveServer, cache: Path) -> tuple[dict[int, list[int]], list[str]]:
    """A training process on the node: every sample it read, and its shards' cache keys."""
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    args = ("tok", server.url, server.token, str(cache), out)
    proc = ctx.Process(target=_read, args=args)
    proc.start()
    result: tuple[dict[int, list[int]], list[str]] = out.get(timeout=120)
    proc.join(60)
    assert proc.exitcode == 0
    return result


def test_a_recreated_dataset_with_equal_shard_sizes_is_read_afresh(
    live_server: LiveServer, tmp_path: Path
) -> None:
    first = write_tokens(tmp_path / "one", N, size_limit=600)
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(tmp_path / "one" / "index.json"), "tok")
    cache = tmp_path / "node-cache"
    got, keys = read_on_node(live_server, cache)
    assert got == {i: token_row(i).tolist() for i in range(N)}

    second = write_tokens(tmp_path / "two", N, size_limit=600, first_id=10_000)
    sizes = [s.raw_data.bytes for s in first.shards]
    assert [s.raw_data.bytes for s in second.shards] == sizes  # only the bytes differ
    with APIClient(live_server.url, live_server.token) as api:
        api.delete_dataset("tok", force=True)
        again = register_index(api, str(tmp_path / "two" / "index.json"), "tok")
    assert again.number == 1
    got, new_keys = read_on_node(live_server, cache)  # the same warm node cache
    assert got == {i: token_row(i).tolist() for i in range(10_000, 10_000 + N)}
    assert not set(keys) & set(new_keys)


def test_another_folder_or_bucket_is_another_entry(tmp_path: Path) -> None:
    write_tokens(tmp_path / "a", N, size_limit=600)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # byte-identical index and shards
    a = resolve_source(Source(str(tmp_path / "a")))
    b = resolve_source(Source(str(tmp_path / "b")))
    assert a.cache_key(0) != b.cache_key(0)
    digest = a.shards[0].raw_data.hashes["xxh3_64"]
    assert a.cache_key(0).endswith(f"/xxh3_64-{digest}/shard.00000.mds")


@pytest.mark.parametrize("same_url", [True, False])
def test_another_server_is_another_entry(
    live_server: LiveServer, tmp_path: Path, same_url: bool
) -> None:
    """The server's identity is part of the key; equal names on two servers never meet."""
    write_tokens(tmp_path / "ds", N, size_limit=600)
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(tmp_path / "ds" / "index.json"), "tok")
    server = ServerOptions(url=live_server.url, token=live_server.token)
    cache = tmp_path / "cache"
    one = resolve_source(Source("tok"), server, cache)
    other_url = live_server.url if same_url else live_server.url.replace("127.0.0.1", "localhost")
    other = ServerOptions(url=other_url, token=live_server.token)
    two = resolve_source(Source("tok"), other, cache)
    assert (one.cache_key(0) == two.cache_key(0)) is same_url
