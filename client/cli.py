"""``shardstream cache stats|prune [DIR]``: see and enforce a node cache's limit.

DIR defaults to the folder readers use by default (``$SHARDSTREAM_CACHE_DIR``, else
``<tmp>/shardstream-cache-<uid>``: :func:`~shardstream.client.options.default_cache_dir`).

Safe while training runs on the node: ``prune`` evicts through the same lock and pin
protocol as the readers (:mod:`~shardstream.client.cache.space`), so a shard in use is
never removed, and a download in flight keeps its reservation. Imports only
:mod:`argparse` at load time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardstream.client.cache.space import CacheSpace

__all__ = ["register"]

_DIR_HELP = (
    "the cache directory (default: $SHARDSTREAM_CACHE_DIR, else <tmp>/shardstream-cache-<uid>, "
    "the folder readers use by default)"
)

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``500M``, ``64GiB``, ``2T`` or a byte count, in binary units."""
    from shardstream.errors import ConfigError

    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    number = raw.rstrip("kmgt")
    try:
        value = int(float(number) * _UNITS[raw[len(number) :]])
    except (ValueError, KeyError):
        raise ConfigError(
            f"cannot read size {text!r}; write e.g. 500M, 64GiB or 1073741824"
        ) from None
    if value < 1:
        raise ConfigError(f"size {text!r} must be at least one byte")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``shardstream cache stats`` and ``shardstream cache prune``."""
    parser = subparsers.add_parser(
        "cache",
        help="show or enforce a node's shard cache limit",
        description="Inspect a node-local shard cache, or evict it back within its limit "
        "(least recently used first, never a shard in use).",
    )
    sub = parser.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    stats = sub.add_parser("stats", help="entries, bytes, limit and pinned shards")
    stats.add_argument("dir", type=Path, nargs="?", help=_DIR_HELP)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(handler=_stats)
    prune = sub.add_parser("prune", help="evict unpinned shards until within the limit")
    prune.add_argument("dir", type=Path, nargs="?", help=_DIR_HELP)
    prune.add_argument(
        "--limit",
        type=parse_size,
        help="the limit to enforce (e.g. 200G; default: the limit its readers last set)",
    )
    prune.add_argument("--json", action="store_true", help="print one JSON object")
    prune.set_defaults(handler=_prune)


def _cache_dir(args: argparse.Namespace) -> Path:
    """The folder given, else the readers' default (filled in on ``args`` for messages)."""
    if args.dir is None:
        from shardstream.client.options import default_cache_dir

        args.dir = default_cache_dir()
    return Path(args.dir)


def _space(root: Path, limit: int | None) -> CacheSpace:
    from shardstream.client.cache.layout import CacheLayout
    from shardstream.client.cache.space import CacheSpace
    from shardstream.errors import ConfigError

    layout = CacheLayout.at(root)
    if not layout.data.is_dir():
        what = "no shardstream cache yet" if not layout.root.exists() else "not a shardstream cache"
        raise ConfigError(
            f"{root} is {what} (it has no data/ folder); give the folder your readers use "
            "(CacheOptions.dir), or set SHARDSTREAM_CACHE_DIR to it"
        )
    return CacheSpace(layout, limit, rescan_interval_s=0.0)


def _recorded_limit(root: Path) -> int | None:
    from shardstream.client.cache.layout import CacheLayout

    try:
        return int(CacheLayout.at(root).limit_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _stats(args: argparse.Namespace) -> int:
    limit = _recorded_limit(_cache_dir(args))
    survey = _space(args.dir, limit).survey()
    total = survey.bytes + survey.download_bytes
    report = {
        "dir": str(args.dir),
        "entries": survey.entries,
        "bytes": survey.bytes,
        "downloading_bytes": survey.download_bytes,
        "limit_bytes": limit,
        "pinned": survey.pinned,
        "pinned_bytes": survey.pinned_bytes,
        "over_limit": limit is not None and total > limit,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"cache      {args.dir}")
    print(f"entries    {survey.entries}")
    print(f"bytes      {_human(survey.bytes)} ({survey.bytes})")
    if survey.download_bytes:
        print(f"downloads  {_human(survey.download_bytes)} reserved")
    print(f"limit      {'none recorded' if limit is None else f'{_human(limit)} ({limit})'}")
    print(f"pinned     {survey.pinned} shards, {_human(survey.pinned_bytes)} (in use now)")
    if report["over_limit"]:
        print("over limit: run `shardstream cache prune` or release the shards in use")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from shardstream.errors import ConfigError

    root = _cache_dir(args)
    limit = args.limit if args.limit is not None else _recorded_limit(root)
    if limit is None:
        raise ConfigError(f"{args.dir}: no limit recorded by a reader; pass --limit SIZE")
    done = _space(args.dir, limit).enforce(force_scan=True)
    report = {
        "evicted": done.evicted,
        "evicted_bytes": done.evicted_bytes,
        "bytes": done.total,
        "limit_bytes": limit,
        "over_limit": done.over,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"evicted {done.evicted} shards ({_human(done.evicted_bytes)}); now "
            f"{_human(done.total)} of {_human(limit)}"
            + (" (still over: the rest is in use)" if done.over else "")
        )
    return 0


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
