"""Object keys: ``/``-separated paths relative to a store's root that can never escape it."""

from __future__ import annotations

from shardstream.errors import ConfigError


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise :class:`ConfigError`.

    Rejected: empty keys, absolute keys (``/a``), backslashes (a Windows path separator
    that would mean something else on a local disk), NUL, and ``.``/``..``/empty
    components, any of which could reach outside the store's root or alias another key.
    """
    problem = _key_problem(key)
    if problem:
        raise ConfigError(
            f"invalid object key {key!r}: {problem}; keys are '/'-separated paths relative "
            "to the store root, like 'shards/shard.00000.mds'"
        )
    return key


def check_prefix(prefix: str) -> str:
    """Validate a listing prefix: ``""``, or a key optionally ending in ``/``."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


def _key_problem(key: str) -> str | None:
    if not isinstance(key, str) or not key:
        return "it is empty"
    if key.startswith("/"):
        return "it is absolute (starts with '/')"
    if "\\" in key:
        return "it contains a backslash"
    if "\x00" in key:
        return "it contains a NUL character"
    for part in key.split("/"):
        if not part:
            return "it has an empty path component ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"it has a {part!r} path component"
    return None


def join_key(prefix: str, key: str) -> str:
    """``prefix`` + ``/`` + ``key``, with no doubled or leading slash."""
    prefix = prefix.strip("/")
    return f"{prefix}/{key}" if prefix else key


def spread_key(basename: str, width: int = 4) -> str:
    """``basename`` under a hashed prefix folder: ``shard.00003.mds`` -> ``1f0c/shard.00003.mds``.

    S3 scales request rates per key prefix (~5,500 GET/s each before ``503 SlowDown``);
    shards spread over ``16**width`` prefixes let many nodes read one dataset at once
    without all landing on one prefix. The prefix is a digest of the name, so the index
    alone says where every shard is; MosaicML's reader accepts such basenames.
    """
    import hashlib

    check_key(basename)
    digest = hashlib.sha1(basename.encode(), usedforsecurity=False).hexdigest()
    return f"{digest[:width]}/{basename}"
