"""Content hashes of shard files, named as MosaicML Streaming names them in ``index.json``.

``sha1`` and ``xxh3_64`` are what the builder writes by default; every name below can be
read and verified. Hex digests match ``hashlib``/``xxhash`` ``hexdigest()`` exactly, which
is what ``streaming.base.hashing`` stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import xxhash

from shardstream.errors import ConfigError, HashMismatchError


class Hasher(Protocol):
    """The incremental interface shared by hashlib and xxhash objects."""

    def update(self, data: bytes | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


_FACTORIES: dict[str, Callable[[], Hasher]] = {
    "md5": hashlib.md5,
    "sha1": hashlib.sha1,
    "sha224": hashlib.sha224,
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
    "xxh32": xxhash.xxh32,
    "xxh64": xxhash.xxh64,
    "xxh128": xxhash.xxh128,
    "xxh3_64": xxhash.xxh3_64,
    "xxh3_128": xxhash.xxh3_128,
}

SUPPORTED_HASHES: tuple[str, ...] = tuple(sorted(_FACTORIES))
"""Every hash algorithm name shardstream can write and verify."""

# Verifying every algorithm an index lists is wasted work: one is enough, fastest first.
_VERIFY_PREFERENCE = ("xxh3_64", "xxh3_128", "xxh64", "xxh128", "xxh32", "sha1", "md5")

_CHUNK = 8 << 20


def new_hasher(algo: str) -> Hasher:
    """Return an incremental hasher for ``algo``; raise :class:`ConfigError` if unknown."""
    try:
        return _FACTORIES[algo]()
    except KeyError:
        raise ConfigError(
            f"unknown hash algorithm {algo!r}; choose from {', '.join(SUPPORTED_HASHES)}"
        ) from None


def hash_bytes(algo: str, data: bytes | memoryview) -> str:
    """Hex digest of ``data`` under ``algo``."""
    hasher = new_hasher(algo)
    hasher.update(data)
    return hasher.hexdigest()


def hash_file(algos: list[str] | tuple[str, ...], path: Path) -> dict[str, str]:
    """Hex digests of the file at ``path`` for each algorithm, read once in chunks."""
    hashers = {algo: new_hasher(algo) for algo in algos}
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {algo: h.hexdigest() for algo, h in hashers.items()}


def choose_verify_algo(hashes: Mapping[str, str]) -> str | None:
    """The cheapest algorithm in ``hashes`` that we can compute, or ``None`` if none."""
    for algo in _VERIFY_PREFERENCE:
        if algo in hashes:
            return algo
    return next((algo for algo in hashes if algo in _FACTORIES), None)


def verify_file(path: Path, hashes: Mapping[str, str], *, what: str) -> None:
    """Check the file against one of the recorded ``hashes``.

    ``what`` names the object in the error (a shard key or URL). Raises
    :class:`HashMismatchError` on a mismatch; does nothing when ``hashes`` is empty.
    """
    algo = choose_verify_algo(hashes)
    if algo is None:
        return
    actual = hash_file([algo], path)[algo]
    if actual != hashes[algo]:
        raise HashMismatchError(
            f"{what}: {algo} is {actual}, the index records {hashes[algo]}; "
            "the object is corrupt or was replaced after the index was written"
        )
