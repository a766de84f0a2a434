"""CacheLayout: the one place that knows the node cache's folders, and what the read path
asks it; nothing outside ``client/cache/`` spells a folder name or a shard's file name."""

from __future__ import annotations

import ast
from pathlib import Path

from shardstream.client.cache.keys import key_to_name
from shardstream.client.cache.layout import CacheLayout, KeyedFolder
from shardstream.client.cache.shard_cache import ShardCache

CLIENT = Path(__file__).resolve().parents[3] / "client"
KEY = "v1/shard.00001.mds"


def test_published_and_in_flight_files_of_a_key(tmp_path: Path) -> None:
    layout = CacheLayout.at(tmp_path)
    layout.create()
    name = key_to_name(KEY)
    assert layout.published(KEY) == layout.data_path(name) == tmp_path / "data" / name
    assert layout.downloads(KEY) == []
    assert layout.shard_files(KEY) == [layout.published(KEY)]  # listed before it exists

    mine = CacheLayout.download_file(layout.tmp_dir(name, 100, 7), KEY)
    other = CacheLayout.download_file(layout.tmp_dir(name, 100, 12), KEY)
    longer = CacheLayout.download_file(layout.tmp_dir(name + ".x", 100, 9), "v1/shard.00001.mds.x")
    empty = layout.tmp_dir(name, 100, 13)  # a download that has not created its file yet
    for path in (mine, other, longer):
        path.parent.mkdir()
        path.write_bytes(b"")
    empty.mkdir()
    (layout.tmp / f"{name}.junk").mkdir()  # nothing a download made

    assert layout.downloads(KEY) == sorted([mine, other])
    assert layout.downloads(KEY, not_of=7) == [other]  # another process's, to join in place
    assert layout.shard_files(KEY) == [*sorted([mine, other]), layout.published(KEY)]
    assert [CacheLayout.is_published(p) for p in layout.shard_files(KEY)] == [False, False, True]


def test_the_cache_writes_where_the_layout_says(tmp_path: Path) -> None:
    """While a fetch runs, the layout lists its file; once done, the published one holds
    the bytes."""
    cache = ShardCache(tmp_path, limit_bytes=None)
    seen: list[list[Path]] = []

    def fetch(target: Path) -> None:
        target.write_bytes(b"x" * 10)
        seen.append(cache.layout.downloads(KEY))
        assert seen[-1] == [target]

    with cache.lease(KEY, fetch, size=10) as path:
        assert path == cache.layout.published(KEY) and CacheLayout.is_published(path)
    assert cache.layout.downloads(KEY) == [] and len(seen) == 1


def test_keyed_folder(tmp_path: Path) -> None:
    folder = KeyedFolder(tmp_path)
    claims = folder.file(KEY, "claims")
    link = folder.file(KEY, "123")
    assert claims == tmp_path / f"{key_to_name(KEY)}.claims"
    for path in (claims, link, folder.file(KEY + ".x", "456")):
        path.write_bytes(b"")
    assert folder.files(KEY) == [(link, "123"), (claims, "claims")]  # not the longer key's
    assert folder.files("v1/other.mds") == []


_FOLDERS = {"data", "tmp", "locks", "verified", "over-limit"}
_NAMES = {"key_to_name", "leaf_name", "parse_tmp_name", "MARKER_SUFFIX"}


def _spellings(source: str) -> list[tuple[int, str]]:
    """Where ``source`` builds a path from one of the cache's folder names (``x / "data"``,
    ``x.name == "data"``, a glob of ``"tmp"``) or imports the cache's file naming."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and "cache" in (node.module or ""):
            found += [(node.lineno, a.name) for a in node.names if a.name in _NAMES]
        elif isinstance(node, ast.BinOp | ast.Compare | ast.Call):
            found += [
                (node.lineno, v.value)
                for v in ast.walk(node)
                if isinstance(v, ast.Constant) and v.value in _FOLDERS
            ]
    return found


def test_nothing_outside_the_cache_spells_its_layout() -> None:
    """Outside ``client/cache/``, no module spells a cache folder or a shard's file name in
    the cache: they ask the layout (:class:`CacheLayout`, :class:`KeyedFolder`)."""
    offenders = []
    for path in sorted(CLIENT.rglob("*.py")):
        rel = path.relative_to(CLIENT)
        if rel.parts[0] != "cache":
            offenders += [f"{rel}:{line} {what!r}" for line, what in _spellings(path.read_text())]
    assert not offenders, f"the cache's layout spelled outside client/cache/: {offenders}"


def test_the_guard_sees_the_old_spellings() -> None:
    """The check above catches what the read path did before it asked the layout."""
    old = (
        "from shardstream.client.cache.keys import key_to_name\n"
        "def f(root, key, path):\n"
        "    if path.parent.name == 'data':\n"
        "        return sorted((root / 'tmp').glob(key_to_name(key) + '.*'))\n"
    )
    assert {what for _, what in _spellings(old)} == {"key_to_name", "data", "tmp"}
