"""Published versions served from memory: the start-up path of a training job.

Every rank of a starting job asks for the version, pages through its shard index and
presigns the URLs of its shards. A published version never changes, so a replica needs
the database for that only the first time it sees the version; after that these
requests cost no query and no thread hop.

- Version snapshots are kept ``ttl_s`` seconds (``SHARDSTREAM_VERSION_CACHE_S``) and
  then checked again. Publishing is the only change a version sees, and deleting its
  dataset the only way it disappears: a deletion through this replica takes effect at
  once (:meth:`PublishedCache.forget_dataset`), through another one within ``ttl_s``,
  as token revocation does. Drafts are never cached.
- Shard index pages are cached as response bytes under their ETag.
- A version's set of shard keys is kept to check presign requests (a million keys in
  all; keys of larger versions are checked in the database, request by request).
- Presigned URLs are reused while at least half of the asked lifetime is left, so a
  thousand ranks presigning the same shards cost one signature each.
- Concurrent misses for the same thing wait for one database query (single flight):
  a cold start of 256 ranks is one query, not 256.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from shardstream.server.cache.singleflight import SingleFlight

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class VersionSnapshot:
    """What the hot routes need of a version, detached from any database session."""

    id: int
    dataset: str
    number: int
    status: str
    storage_root: str
    published_us: int | None  # publication time in microseconds (part of the ETag)
    num_shards: int
    public_json: bytes  # the ``VersionPublic`` body

    @property
    def published(self) -> bool:
        return self.status == "published" and self.published_us is not None

    def etag(self, *parts: object) -> str | None:
        """A strong ETag (plus page parameters) for a published version; None for drafts."""
        if not self.published:
            return None
        suffix = "".join(f"-{p}" for p in parts)
        return f'"v{self.id}.{self.published_us}{suffix}"'


def gzip_etag(etag: str) -> str:
    """The strong ETag of the gzip-compressed form of the body tagged ``etag``."""
    return etag[:-1] + '.gz"'


def _gzip(body: bytes) -> bytes:
    # mtime=0: the same page compresses to the same bytes in every process and replica
    return gzip.compress(body, compresslevel=1, mtime=0)  # ~6x smaller already, and fast


class _LRU(Generic[K, T]):
    """A small thread-safe LRU map."""

    def __init__(self, capacity: int) -> None:
        self._items: OrderedDict[K, T] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def get(self, key: K) -> T | None:
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
            return item

    def put(self, key: K, value: T) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)

    def drop(self, keep: Callable[[K, T], bool]) -> None:
        with self._lock:
            for key in [k for k, v in self._items.items() if not keep(k, v)]:
                del self._items[key]


class ByteCache:
    """A thread-safe LRU of immutable response bodies, bounded by total bytes.

    Only content of published versions goes in (it never changes), keyed by its ETag;
    every request still checks the version and the token before a cached body is used.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._max = max_bytes
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        """The cached body for ``key``, if any."""
        with self._lock:
            body = self._items.get(key)
            if body is not None:
                self._items.move_to_end(key)
            return body

    def put(self, key: str, body: bytes) -> None:
        """Remember ``body`` (bodies larger than a quarter of the cache are not kept)."""
        if len(body) > self._max // 4:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self._max:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)


class PublishedCache:
    """Snapshots, index pages and presigned URLs of published versions, per process."""

    def __init__(
        self,
        ttl_s: float,
        *,
        max_versions: int = 4096,
        max_page_bytes: int = 64 << 20,
        max_urls: int = 65_536,
        max_keys: int = 1_000_000,
    ) -> None:
        self._ttl = ttl_s
        self._versions: _LRU[tuple[str, int], tuple[VersionSnapshot, float]] = _LRU(max_versions)
        self._version_flight: SingleFlight[tuple[str, int], VersionSnapshot] = SingleFlight()
        self.pages = ByteCache(max_page_bytes)
        self._page_flight: SingleFlight[str, bytes] = SingleFlight()
        # Keys and URLs are kept per (row id, publication time): SQLite hands the id of a
        # deleted version out again, and a newer version must not see the old one's.
        self._urls: _LRU[tuple[int, int | None, str], tuple[str, float]] = _LRU(max_urls)
        self._keys: OrderedDict[tuple[int, int | None], frozenset[str]] = OrderedDict()
        self._key_count = 0
        self._max_keys = max_keys
        self._keys_lock = threading.Lock()
        self._key_flight: SingleFlight[tuple[int, int | None], frozenset[str]] = SingleFlight()

    async def version(
        self, dataset: str, number: int, load: Callable[[], VersionSnapshot]
    ) -> VersionSnapshot:
        """The version's snapshot; ``load`` (run in the thread pool) on a miss."""
        key = (dataset, number)
        hit = self._versions.get(key)
        if hit is not None and time.monotonic() - hit[1] <= self._ttl:
            return hit[0]

        async def fetch() -> VersionSnapshot:
            snapshot = await run_in_threadpool(load)
            if snapshot.published and self._ttl > 0:
                self._versions.put(key, (snapshot, time.monotonic()))
            return snapshot

        return await self._version_flight.run(key, fetch)

    def forget_dataset(self, dataset: str) -> None:
        """Drop the dataset's versions (it was deleted through this process)."""
        self._versions.drop(lambda key, _: key[0] != dataset)

    async def page(
        self, etag: str | None, load: Callable[[], bytes], *, gzipped: bool = False
    ) -> bytes:
        """A shard index page by ETag, gzip-compressed if ``gzipped`` (both forms are kept,
        each made once); drafts (no ETag) are loaded every time, never compressed."""
        if etag is None:
            return await run_in_threadpool(load)
        key = gzip_etag(etag) if gzipped else etag
        body = self.pages.get(key)
        if body is not None:
            return body

        async def fetch() -> bytes:
            if gzipped:
                plain = await self.page(etag, load)
                loaded = await run_in_threadpool(_gzip, plain)
            else:
                loaded = await run_in_threadpool(load)
            self.pages.put(key, loaded)
            return loaded

        return await self._page_flight.run(key, fetch)

    async def keys(
        self, version: VersionSnapshot, load: Callable[[], frozenset[str]]
    ) -> frozenset[str] | None:
        """Every shard key of a published version (``load`` in the thread pool on a miss);
        None for drafts and for versions too large to keep (``max_keys`` in all)."""
        if not version.published or version.num_shards > self._max_keys // 4:
            return None
        ident = (version.id, version.published_us)
        with self._keys_lock:
            hit = self._keys.get(ident)
            if hit is not None:
                self._keys.move_to_end(ident)
                return hit

        async def fetch() -> frozenset[str]:
            loaded = await run_in_threadpool(load)
            with self._keys_lock:
                if ident not in self._keys:
                    self._keys[ident] = loaded
                    self._key_count += len(loaded)
                while self._key_count > self._max_keys:
                    _, old = self._keys.popitem(last=False)
                    self._key_count -= len(old)
            return loaded

        return await self._key_flight.run(ident, fetch)

    async def urls(
        self,
        version: VersionSnapshot,
        keys: list[str],
        expires_s: int,
        sign: Callable[[list[str]], tuple[dict[str, str], float]],
    ) -> tuple[dict[str, str], float]:
        """URLs for ``keys`` and the time (epoch seconds) the first of them expires.

        A cached URL is reused while at least half of ``expires_s`` is left; ``sign``
        (run in the thread pool) signs the rest and returns their expiry. The caller has
        checked that ``keys`` belong to the version.
        """
        ident = (version.id, version.published_us)
        now = time.time()
        urls: dict[str, str] = {}
        expires_at = now + expires_s
        missing: list[str] = []
        for key in keys:
            hit = self._urls.get((*ident, key))
            # Reused only if it neither expires too soon nor outlives what was asked.
            if hit is not None and expires_s / 2 <= hit[1] - now <= expires_s:
                urls[key] = hit[0]
                expires_at = min(expires_at, hit[1])
            else:
                missing.append(key)
        if missing:
            signed, until = await run_in_threadpool(sign, missing)
            for key, url in signed.items():
                self._urls.put((*ident, key), (url, until))
            urls.update(signed)
            expires_at = min(expires_at, until)
        return {key: urls[key] for key in keys}, expires_at
