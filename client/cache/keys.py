"""The node cache's file names: a shard key's flat file name, a download folder's name.

The folders they live in are :mod:`~shardstream.client.cache.layout`'s. A key such as
``"<version-id>/shard.00001.mds"`` becomes one flat, reversible file name (``/`` and every
other unsafe byte percent-escaped), so a key can never name anything outside its folder,
and ``ls data/`` still reads like the keys. Very long keys keep a
readable prefix plus a hash, since file names are limited to 255 bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from urllib.parse import quote

from shardstream.errors import ConfigError

__all__ = ["MARKER_SUFFIX", "TmpEntry", "key_to_name", "leaf_name", "parse_tmp_name"]

MARKER_SUFFIX = ".ok"

# Escaped names stay well under NAME_MAX (255) even with the tmp suffix ".<size>.<pid>".
_MAX_NAME = 180
_MAX_KEY = 4096


def key_to_name(key: str) -> str:
    """The file name of ``key`` inside ``data/``: flat, safe and injective.

    Raises ConfigError for keys that are empty, absolute, contain NUL, or have empty,
    ``.`` or ``..`` path components (nothing may resolve outside the cache).

    >>> key_to_name("v1/shard.00001.mds")
    'v1%2Fshard.00001.mds'
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"cache key {key!r} is empty; give '<version>/<shard basename>'")
    if len(key) > _MAX_KEY or "\x00" in key:
        raise ConfigError(f"cache key {key[:80]!r}... is longer than {_MAX_KEY} or contains NUL")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"cache key {key!r} is absolute or has an empty, '.' or '..' component; "
            "keys are relative paths like '<version>/shard.00000.mds'"
        )
    # quote() leaves '~' alone; escape it too so '~' only ever marks a hashed name.
    name = quote(key, safe="").replace("~", "%7E")
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        name = f"{name[: _MAX_NAME - 34]}~h{digest}"
    return name


def leaf_name(key: str) -> str:
    """A readable file name for the fetch's target: the key's last component, escaped."""
    leaf = quote(key.rsplit("/", 1)[-1], safe="")
    return leaf[-100:] if len(leaf) > 100 else leaf


@dataclass(frozen=True)
class TmpEntry:
    """One in-flight download folder under ``tmp/``: whose shard, how big, which pid."""

    name: str
    size: int
    pid: int


def parse_tmp_name(entry: str) -> TmpEntry | None:
    """Parse ``<name>.<size>.<pid>``; None for anything we did not create."""
    parts = entry.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return TmpEntry(parts[0], int(parts[1]), int(parts[2]))
