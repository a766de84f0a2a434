"""The ``ObjectStore`` interface every backend implements, and the download finishing step."""

from __future__ import annotations

import contextlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from shardstream.errors import HashMismatchError, StorageError
from shardstream.hashing import verify_file

TEMP_PREFIX = ".shardstream-tmp."
"""Name prefix of in-flight temp files; never listed as keys."""


@dataclass(frozen=True)
class StoreCapabilities:
    """What a store can do, declared by its backend so that callers ask instead of probing
    its type or attributes (:attr:`ObjectStore.capabilities`).

    >>> LocalStore("/data").capabilities.local            # doctest: +SKIP
    True
    """

    local_root: Path | None = None
    """The folder the store's objects are files in, where its reads are local file reads
    (a cache copy of them would only duplicate the file); ``None`` for remote stores."""
    presigns: bool = False
    """Whether :meth:`ObjectStore.presign_get` hands out URLs anyone can GET for a while."""
    max_connections: int = 0
    """The most requests the store runs at once in this process (0: no connection pool)."""
    connection_limit: Callable[[], int] | None = None
    """The requests the store lets run at once now (its adaptive limit, read anew on each
    call, in whichever process calls); ``None`` where nothing limits them."""

    @property
    def local(self) -> bool:
        """Whether reads are local file reads."""
        return self.local_root is not None


class ObjectStore(ABC):
    """A flat namespace of byte objects under a root (a directory, an S3 prefix, URLs).

    Keys are ``/``-separated paths relative to the root and can never escape it (see
    :func:`shardstream.storage.check_key`). Writes and downloads become visible
    atomically: a reader sees the old object, the whole new object, or nothing.

    >>> store = open_store("/tmp/shards")          # doctest: +SKIP
    >>> store.write_bytes("a/b.bin", b"hello")     # doctest: +SKIP
    >>> store.read_bytes("a/b.bin")                # doctest: +SKIP
    b'hello'

    Every backend declares its :attr:`capabilities`; a store that wraps another one passes
    its inner store's through.
    """

    @property
    @abstractmethod
    def capabilities(self) -> StoreCapabilities:
        """What this store can do (local reads, presigning, its connection limit)."""

    def presign_get(self, key: str, expires_s: int = 3600) -> str:
        """A URL anyone can GET for ``expires_s`` seconds; only where
        ``capabilities.presigns`` (else :class:`StorageError`)."""
        raise StorageError(f"{self.url(key)}: this store cannot presign URLs")

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The whole object; :class:`ObjectNotFoundError` if missing."""

    @abstractmethod
    def download(
        self,
        key: str,
        dest: Path,
        *,
        expected_size: int | None = None,
        expected_hashes: Mapping[str, str] | None = None,
    ) -> None:
        """Write the object to ``dest`` atomically, after checking its size and hash.

        Nothing appears at ``dest`` unless every byte arrived and matched: a size or hash
        mismatch raises :class:`HashMismatchError`, a missing object
        :class:`ObjectNotFoundError`, other failures (after retries) :class:`StorageError`.
        """

    def read_range(
        self, key: str, start: int, end: int, *, expected_size: int | None = None
    ) -> bytes | bytearray:
        """Bytes ``start .. end - 1`` of the object (one ranged read, retried and resumed).

        ``expected_size`` is the object's recorded size: an object of another size raises
        :class:`HashMismatchError` (it was replaced or truncated). A range past the end of
        the object raises :class:`StorageError`. This default reads the whole object;
        backends override it with a real ranged read.
        """
        data = self.read_bytes(key)
        check_size(len(data), expected_size, key)
        return check_range(data[start:end], start, end, key)

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; readers see it only once it is complete."""

    @abstractmethod
    def upload(self, src: Path, key: str) -> None:
        """Store the file ``src`` under ``key`` (multipart for large files on S3)."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, or ``None`` if it does not exist."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``, sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; deleting a missing key is not an error."""

    @abstractmethod
    def url(self, key: str = "") -> str:
        """The canonical URL of ``key`` (``s3://...``, ``file://...``, ``https://...``)."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        return self.size(key) is not None

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release connections and threads (the store stays usable: they are rebuilt)."""

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def temp_path_for(dest: Path) -> Path:
    """A unique temp file beside ``dest`` (same filesystem, so ``os.replace`` is atomic)."""
    return dest.parent / f"{TEMP_PREFIX}{dest.name}.{uuid.uuid4().hex[:12]}"


def check_size(actual: int, expected: int | None, what: str) -> None:
    """Raise :class:`HashMismatchError` if the object's size is not the recorded one."""
    if expected is not None and actual != expected:
        raise HashMismatchError(
            f"{what}: size is {actual} bytes, the index records {expected}; "
            "the object is truncated or was replaced after the index was written"
        )


def check_range(data: bytes, start: int, end: int, what: str) -> bytes:
    """``data`` if it holds all of ``start .. end - 1``, else :class:`StorageError`."""
    if not 0 <= start <= end:
        raise StorageError(f"{what}: invalid byte range {start}..{end}")
    if len(data) != end - start:
        raise StorageError(
            f"{what}: bytes {start}..{end - 1} asked, {len(data)} exist there; the object "
            "is shorter than its index entry says"
        )
    return data


def finish_download(
    tmp: Path,
    dest: Path,
    *,
    what: str,
    expected_size: int | None,
    expected_hashes: Mapping[str, str] | None,
) -> None:
    """Verify the complete temp file, then rename it to ``dest`` (removing it on failure)."""
    try:
        check_size(tmp.stat().st_size, expected_size, what)
        if expected_hashes:
            verify_file(tmp, expected_hashes, what=what)
        os.replace(tmp, dest)
    except OSError as exc:
        raise StorageError(f"{what}: cannot write {dest}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
