"""The node-local copy of a server version's index: one download per node, none on restart."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from shardstream.api_client import APIClient
from shardstream.client import CacheOptions, ServerOptions, StreamingDataset
from shardstream.client.sources.index_cache import KEEP, cached_index, decode, encode
from shardstream.errors import ConfigError
from shardstream.mds import FileInfo, MDSIndex, ShardInfo, load_index
from shardstream.shard_builder.publish import register_index
from tests.fixtures.datasets import write_tokens
from tests.fixtures.server import LiveServer


def _index(*keys: str) -> tuple[MDSIndex, list[str]]:
    """A small index of one-sample shards named ``keys`` (which tell downloads apart)."""
    shards = [
        ShardInfo(("int",), ("x",), (8,), None, (), FileInfo(key, 9, {}), 1, None) for key in keys
    ]
    return MDSIndex(shards), list(keys)


SHARDS_ROUTE = "/v1/datasets/{name}/versions/{number}/shards"
VERSION_ROUTE = "/v1/datasets/{name}/versions/{number}"


def _requests(server: LiveServer, route: str) -> float:
    """Successful GETs of ``route`` the server has answered so far (from /metrics)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    labels = f'{{method="GET",route="{route}",status="200"}}'
    prefix = f"shardstream_http_requests_total{labels} "
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


def _open_dataset(url: str, token: str, cache: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    os.environ["SHARDSTREAM_TOKEN"] = token
    ds = StreamingDataset(
        "tok@1", 4, server=ServerOptions(url=url), cache=CacheOptions(dir=Path(cache))
    )
    out.put(len(ds.resolved[0].keys))


def _slow_download(folder: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    def download() -> bytes:
        with open(Path(folder) / "downloads", "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return _index("downloaded")

    out.put(cached_index(Path(folder), "one version", download)[1])


def _hang(folder: str) -> None:
    def download() -> bytes:
        (Path(folder) / "started").touch()
        time.sleep(600)
        return _index()

    cached_index(Path(folder), "one version", download)


@pytest.fixture
def tok(live_server: LiveServer, tmp_path: Path) -> int:
    """A published dataset ``tok`` in a local folder; its shard count."""
    write_tokens(tmp_path / "ds", 120, size_limit=600)
    with APIClient(live_server.url, live_server.token) as api:
        version = register_index(api, str(tmp_path / "ds" / "index.json"), "tok")
    return version.num_shards


def test_ranks_of_a_node_download_the_index_once_and_restarts_never(
    live_server: LiveServer, tok: int, tmp_path: Path
) -> None:
    cache = str(tmp_path / "node-cache")
    pages, versions = _requests(live_server, SHARDS_ROUTE), _requests(live_server, VERSION_ROUTE)
    ctx = mp.get_context("spawn")
    out: mp.Queue[int] = ctx.Queue()
    ranks = [
        ctx.Process(target=_open_dataset, args=(live_server.url, live_server.token, cache, out))
        for _ in range(4)
    ]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
        assert p.exitcode == 0
    assert sorted(out.get() for _ in ranks) == [tok] * 4
    assert _requests(live_server, SHARDS_ROUTE) - pages == 1  # one page, one process
    assert _requests(live_server, VERSION_ROUTE) - versions == 4  # every rank pins the version

    _open_dataset(live_server.url, live_server.token, cache, out)  # a restart
    assert out.get() == tok
    assert _requests(live_server, SHARDS_ROUTE) - pages == 1


def test_a_dataset_recreated_under_the_same_name_is_read_afresh(
    live_server: LiveServer, tok: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    cache = CacheOptions(dir=tmp_path / "node-cache")
    server = ServerOptions(url=live_server.url)
    assert len(StreamingDataset("tok", 4, server=server, cache=cache).resolved[0].keys) == tok
    write_tokens(tmp_path / "bigger", 480, size_limit=600)
    with APIClient(live_server.url) as api:
        api.delete_dataset("tok", force=True)
        bigger = register_index(api, str(tmp_path / "bigger" / "index.json"), "tok")
    assert bigger.number == 1 and bigger.num_shards > tok
    again = StreamingDataset("tok@1", 4, server=server, cache=cache)
    assert len(again.resolved[0].keys) == bigger.num_shards


def test_a_draft_is_refused_by_name(
    live_server: LiveServer, tok: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDSTREAM_TOKEN", live_server.token)
    with APIClient(live_server.url) as api:
        draft = api.create_version("tok", {"x": "int"}, storage_root=(tmp_path / "d").as_uri())
    with pytest.raises(ConfigError, match=rf"tok@{draft.number} is draft; only published"):
        StreamingDataset(f"tok@{draft.number}", 4, server=ServerOptions(url=live_server.url))


def test_concurrent_processes_share_one_download(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    out: mp.Queue[bytes] = ctx.Queue()
    procs = [ctx.Process(target=_slow_download, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert [out.get() for _ in procs] == [["downloaded"]] * 4
    assert len((tmp_path / "downloads").read_text().splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == [
        f"{next((tmp_path / 'index').glob('*.json')).name}"
    ]  # no lock or temporary file left


def test_a_download_killed_midway_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = mp.get_context("spawn").Process(target=_hang, args=(str(tmp_path),))
    proc.start()
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.is_alive()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # holds the lock, has written nothing
    proc.join(30)
    assert not list((tmp_path / "index").glob("*.json"))
    assert cached_index(tmp_path, "one version", lambda: _index("fresh"))[1] == ["fresh"]
    assert cached_index(tmp_path, "one version", lambda: _index("again"))[1] == ["fresh"]


def test_only_the_most_recently_used_indexes_are_kept(tmp_path: Path) -> None:
    cached_index(tmp_path, "first", lambda: _index("1"))
    for i in range(KEEP + 5):
        cached_index(tmp_path, f"v{i}", lambda: _index("x"))
        cached_index(tmp_path, "first", lambda: _index("re-downloaded"))  # used again: kept
        time.sleep(0.002)  # distinct modification times
    assert len(list((tmp_path / "index").glob("*.json"))) == KEEP
    assert cached_index(tmp_path, "first", lambda: _index("re-downloaded"))[1] == ["1"]
    assert cached_index(tmp_path, "v0", lambda: _index("re-downloaded"))[1] == ["re-downloaded"]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_the_compact_file_gives_back_the_same_index(
    tmp_path: Path, compression: str | None
) -> None:
    write_tokens(tmp_path / "ds", 120, size_limit=600, compression=compression)
    index = load_index(tmp_path / "ds" / "index.json")
    keys = [shard.stored.basename for shard in index.shards]
    assert len(index.shards) > 3
    again, again_keys = decode(encode(index, keys), tmp_path / "x.json")
    assert again == index and again_keys == keys
    # Each shard's own digests (file, blocks, header, piece table) cannot be shared; in these
    # 3-sample shards they are most of an entry, and the rest still shrinks to a fraction.
    assert len(encode(index, keys)) < 0.6 * len((tmp_path / "ds" / "index.json").read_bytes())


def test_a_damaged_file_is_downloaded_again(tmp_path: Path) -> None:
    cached_index(tmp_path, "v", lambda: _index("first"))
    [path] = (tmp_path / "index").glob("*.json")
    path.write_bytes(path.read_bytes()[:-5])  # truncated
    assert cached_index(tmp_path, "v", lambda: _index("second"))[1] == ["second"]
    assert cached_index(tmp_path, "v", lambda: _index("third"))[1] == ["second"]
