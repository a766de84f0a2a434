"""The node cache is private to its user: a folder another local user owns or can write
is refused (that user could swap a cached shard and forge its verified marker), and what
the cache creates is 0700 / 0600 whatever the umask. The same rule as the memory-peer
folder, from one module (``client/cache/private_paths.py``)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardstream.client import CacheOptions
from shardstream.client.cache.shard_cache import ShardCache
from shardstream.client.reads.peer_files import MemoryPeers
from shardstream.client.sources.index_cache import cached_index
from shardstream.errors import ConfigError
from shardstream.mds import MDSIndex

OTHER_UID = 12345
KEY = "v1/shard.00000.mds"


def _fetch(tmp: Path) -> None:
    tmp.write_bytes(b"x" * 1000)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """A umask that lets everyone read and write what is created (then restored)."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=f"{theirs}.*another user.*uid {OTHER_UID}"):
        ShardCache(theirs)
    assert os.listdir(theirs) == []  # nothing was created in it
    # Also as the default folder (under the temp dir), and for a cache subfolder.
    mine = tmp_path / "mine"
    ShardCache(mine)
    os.chown(mine / "verified", OTHER_UID, OTHER_UID)
    with pytest.raises(ConfigError, match=r"verified.*another user"):
        ShardCache(mine)
    # And for the node index of a server version, which lives in the same folder.
    with pytest.raises(ConfigError, match="another user"):
        cached_index(theirs, "x", lambda: (MDSIndex(shards=[]), []))


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o722])
def test_a_folder_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(ConfigError, match=f"{shared} can be written by other users.*chmod go-w"):
        ShardCache(shared)
    mine = tmp_path / "mine"
    ShardCache(mine)
    (mine / "data").chmod(mode)
    with pytest.raises(ConfigError, match="data can be written by other users"):
        ShardCache(mine)


def test_a_link_to_a_file_or_a_planted_subfolder_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        ShardCache(tmp_path / "file")
    mine = tmp_path / "mine"
    ShardCache(mine)
    (mine / "locks").rmdir()
    (mine / "locks").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ConfigError, match="locks is not a folder"):
        ShardCache(mine)


def test_a_link_to_a_folder_of_ones_own_is_used_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    cache = ShardCache(tmp_path / "link")
    assert cache.root == tmp_path / "real"  # resolved once: swapping the link later is moot
    with cache.lease(KEY, _fetch, size=1000) as path:
        assert path.read_bytes() == b"x" * 1000


def test_files_and_folders_created_are_private_whatever_the_umask(
    tmp_path: Path, loose_umask: None
) -> None:
    root = tmp_path / "cache"
    cache = ShardCache(root, limit_bytes=10_000)
    with cache.lease(KEY, _fetch, size=1000) as path:
        assert _mode(path) == 0o600
    assert _mode(root) == 0o700
    for folder in ("data", "tmp", "locks", "verified"):
        assert _mode(root / folder) == 0o700, folder
    files = [p for p in root.rglob("*") if p.is_file()]
    assert {p.relative_to(root).parts[0] for p in files} >= {"data", "verified", "usage", "limit"}
    assert {str(p.relative_to(root)): _mode(p) for p in files} == {
        str(p.relative_to(root)): 0o600 for p in files
    }
    cached_index(root, "x", lambda: (MDSIndex(shards=[]), []))
    assert _mode(root / "index") == 0o700
    assert {_mode(p) for p in (root / "index").iterdir()} == {0o600}


def test_an_own_cache_from_before_is_tightened_not_refused(tmp_path: Path) -> None:
    root = tmp_path / "old"
    for folder in ("data", "tmp", "locks", "verified"):
        (root / folder).mkdir(parents=True)
        (root / folder).chmod(0o755)  # what the cache created before this rule
    root.chmod(0o755)
    ShardCache(root)
    assert _mode(root) == 0o755  # the folder the user chose keeps its mode
    assert _mode(root / "data") == 0o700  # others can no longer read the shards


def test_the_default_cache_folder_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    shared_tmp.chmod(0o1777)  # like /tmp: world-writable and sticky
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    monkeypatch.delenv("SHARDSTREAM_CACHE_DIR", raising=False)
    root = CacheOptions().root
    assert root.parent == shared_tmp
    for _ in range(2):  # created, then reopened
        cache = ShardCache(root)
        with cache.lease(KEY, _fetch, size=1000) as path:
            assert path.read_bytes() == b"x" * 1000
    assert _mode(root) == 0o700
    # The memory-peer folder beside it follows the same rule.
    assert MemoryPeers().shared
