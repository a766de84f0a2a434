"""Parallel, resumable, verified downloads shared by the remote backends (S3, HTTP).

A backend only says how to GET a byte range (:meth:`RemoteStore._get_range`). This
module turns that into whole-object transfers: the first part's response tells the
object's size and ETag, the rest is fetched as parallel ranged GETs (``If-Match`` the
ETag, so parts of two versions never mix) through one bounded pool per store, and a part
cut mid-way resumes from the last byte received instead of starting over.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from shardstream.errors import StorageError, TransientStorageError

from ._base import ObjectStore, StoreCapabilities, check_size, finish_download, temp_path_for
from ._concurrency import AdaptiveLimit
from ._keys import check_key
from ._options import StorageOptions
from ._retry import Backoff, retries_so_far

T = TypeVar("T")


class ForkLocal(Generic[T]):
    """A lazily built value (client, pool) that each process builds for itself.

    DataLoader workers fork with the parent's store; sockets and threads must not be
    shared across the fork, so the value is rebuilt when the pid changes, and is dropped
    when the store is pickled (spawned workers).
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._pid = -1
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The value for this process, built on first use."""
        pid = os.getpid()
        if self._pid != pid:
            # A lock inherited through fork may be held by a thread that does not exist here.
            self._lock = threading.Lock() if self._pid != -1 else self._lock
            with self._lock:
                if self._pid != pid:
                    self._value = self._factory()
                    self._pid = pid
        assert self._value is not None
        return self._value

    def built(self) -> T | None:
        """The value if this process built it already, else ``None``."""
        return self._value if self._pid == os.getpid() else None

    def reset(self) -> None:
        """Forget the value; the next :meth:`get` builds a new one."""
        self._pid, self._value = -1, None

    def __getstate__(self) -> dict[str, Any]:
        return {"_factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_factory"])  # type: ignore[misc]


@dataclass
class RangeBody:
    """One ranged GET response: where it starts, the object's total size, and the bytes."""

    start: int
    total_size: int
    etag: str | None
    chunks: Iterator[bytes]
    """Body chunks; errors while streaming are already shardstream errors."""
    close: Callable[[], None]
    ranged: bool = True
    """False when the server ignored Range and sent the whole object from byte 0."""
    readinto: Callable[[memoryview], int] | None = None
    """Reads the next body bytes straight into a buffer (0 at the end), where the client
    allows it: one copy from the socket instead of a chunk object and a second copy.
    Used instead of ``chunks``, never together with them."""


class Sink(Protocol):
    """Where downloaded bytes go: a file or a buffer, written at offsets by many threads."""

    def allocate(self, size: int) -> None: ...

    def write(self, offset: int, data: bytes) -> None: ...


class FileSink:
    """Writes parts into an open file with ``pwrite`` (thread-safe, no shared position)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def allocate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def write(self, offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(self.fd, view, offset)
            view, offset = view[written:], offset + written


class BufferSink:
    """Collects the object in memory (``read_bytes``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def allocate(self, size: int) -> None:
        self.buffer = bytearray(size)

    def write(self, offset: int, data: bytes) -> None:
        self.buffer[offset : offset + len(data)] = data


_LIMITS: dict[tuple[int, int, int, int], AdaptiveLimit] = {}
_LIMITS_LOCK = threading.Lock()


def shared_limit(options: StorageOptions) -> AdaptiveLimit:
    """The process-wide adaptive limit for stores with these connection bounds.

    Every store of a process (one per dataset source, the index reader, ...) shares it, so
    the process as a whole, not each store, stays under what the object store accepts.
    """
    low = min(options.min_connections, options.max_connections)
    start = max(low, min(options.start_connections, options.max_connections))
    key = (os.getpid(), low, options.max_connections, start)
    with _LIMITS_LOCK:
        limit = _LIMITS.get(key)
        if limit is None:
            for stale in [k for k in _LIMITS if k[0] != key[0]]:
                del _LIMITS[stale]  # inherited through fork: its counts are the parent's
            limit = _LIMITS[key] = AdaptiveLimit(
                minimum=low, maximum=options.max_connections, start=start
            )
    return limit


def storage_counters() -> tuple[int, int, int, int]:
    """This process's remote storage figures: (requests, bytes received, requests
    throttled (503 SlowDown, 429) or timed out, retries), over every store's shared limit.
    Inherited through a fork: callers count differences."""
    pid = os.getpid()
    with _LIMITS_LOCK:
        stats = [limit.stats for key, limit in _LIMITS.items() if key[0] == pid]
    return (
        sum(s.requests for s in stats),
        sum(s.bytes for s in stats),
        sum(s.throttled for s in stats),
        retries_so_far(),
    )


class RemoteStore(ObjectStore):
    """Base of stores reached over the network: bounded pool, ranged parallel downloads."""

    def __init__(self, options: StorageOptions) -> None:
        self.options = options
        self._pool = ForkLocal(self._new_pool)
        self._slots = ForkLocal(self._new_slots)

    def _new_slots(self) -> AdaptiveLimit:
        return shared_limit(self.options)

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.options.max_connections, thread_name_prefix="shardstream")

    @property
    def limit(self) -> AdaptiveLimit:
        """The process's adaptive request limit this store goes through."""
        return self._slots.get()

    def _remote_capabilities(self, *, presigns: bool) -> StoreCapabilities:
        """A network store's capabilities: its pool's size and its adaptive limit."""
        return StoreCapabilities(
            presigns=presigns,
            max_connections=self.options.max_connections,
            connection_limit=lambda: self.limit.limit,
        )

    @abstractmethod
    def _get_range(self, key: str, start: int, end: int, etag: str | None) -> RangeBody:
        """GET bytes ``start..end`` (inclusive; clipped to the object) of ``key``.

        Must answer an empty object with ``total_size=0`` and no chunks, raise shardstream
        errors only, and raise :class:`StorageError` if ``etag`` no longer matches.
        """

    @abstractmethod
    def _describe(self, key: str) -> str:
        """How error messages name ``key`` (its URL, without any secret)."""

    def read_bytes(self, key: str) -> bytes:
        """The whole object, fetched in parallel parts if it is large."""
        sink = BufferSink()
        self._transfer(check_key(key), sink, None)
        return bytes(sink.buffer)

    def download(
        self,
        key: str,
        dest: Path,
        *,
        expected_size: int | None = None,
        expected_hashes: Mapping[str, str] | None = None,
    ) -> None:
        """Parallel ranged download to a temp file, verified, then renamed to ``dest``."""
        what = self._describe(check_key(key))
        tmp = temp_path_for(dest)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            raise StorageError(f"{what}: cannot create {tmp}: {exc.strerror or exc}") from exc
        try:
            try:
                self._transfer(key, FileSink(fd), expected_size)
            finally:
                os.close(fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        finish_download(
            tmp, dest, what=what, expected_size=expected_size, expected_hashes=expected_hashes
        )

    def read_range(
        self, key: str, start: int, end: int, *, expected_size: int | None = None
    ) -> bytes | bytearray:
        """One ranged GET of bytes ``start .. end - 1`` through the process's adaptive
        limit; a cut response resumes from the last byte received, throttling and
        timeouts back off (jittered) and shrink the limit."""
        what = self._describe(check_key(key))
        if not 0 <= start <= end:
            raise StorageError(f"{what}: invalid byte range {start}..{end}")
        out = bytearray(end - start)
        cursor = _Cursor(start, end - 1)
        backoff = Backoff(self.options, what)
        while cursor.offset <= cursor.end:
            attempt_start = cursor.offset
            try:
                with self._slots.get().slot() as sent:
                    self._read_into(
                        key,
                        cursor=cursor,
                        out=out,
                        base=start,
                        expected_size=expected_size,
                        what=what,
                    )
                    sent(cursor.offset - attempt_start)
                if cursor.offset <= cursor.end:
                    raise TransientStorageError(
                        f"{what}: response ended at byte {cursor.offset}, expected up to "
                        f"{cursor.end}"
                    )
            except TransientStorageError as exc:
                backoff.failed(exc, progressed=cursor.offset > attempt_start)
        return out  # not copied into bytes: 4 MiB blocks are a GB a second here

    def _read_into(
        self,
        key: str,
        *,
        cursor: _Cursor,
        out: bytearray,
        base: int,
        expected_size: int | None,
        what: str,
    ) -> None:
        body = self._get_range(key, cursor.offset, cursor.end, None)
        try:
            check_size(body.total_size, expected_size, what)
            if cursor.end >= body.total_size:
                raise StorageError(
                    f"{what}: bytes up to {cursor.end} asked, the object has "
                    f"{body.total_size}; it is shorter than its index entry says"
                )
            if body.readinto is not None and cursor.offset == body.start:
                view = memoryview(out)
                while cursor.offset <= cursor.end:
                    got = body.readinto(view[cursor.offset - base : cursor.end + 1 - base])
                    if not got:
                        break
                    cursor.offset += got
                return
            for data in _wanted(body, cursor):
                at = cursor.offset - base
                out[at : at + len(data)] = data
                cursor.offset += len(data)
        finally:
            body.close()

    def close(self) -> None:
        """Shut the worker threads down (rebuilt on next use)."""
        pool = self._pool.built()
        if pool is not None:
            pool.shutdown(wait=True)
        self._pool.reset()

    def _transfer(self, key: str, sink: Sink, expected_size: int | None) -> None:
        _Transfer(self, key, sink, expected_size).run()


@dataclass
class _Cursor:
    """Progress of one part: the next byte to fetch and the last byte wanted."""

    offset: int
    end: int


def _wanted(body: RangeBody, cursor: _Cursor) -> Iterator[bytes]:
    """The body's bytes from ``cursor.offset`` through ``cursor.end``, in order; the caller
    advances ``cursor.offset`` past each before taking the next.

    What a server that ignored Range sent before the offset is skipped. Once the last
    wanted byte is out, a ranged body is stepped past its end, so that the client sees it
    read whole and keeps the connection for the next request (httpx closes a connection
    whose body was left unread: a TLS handshake a GET)."""
    skip = cursor.offset - body.start
    for received in body.chunks:
        cut = min(skip, len(received))
        skip -= cut
        data = received[cut : cut + cursor.end + 1 - cursor.offset]
        if data:
            yield data
        if cursor.offset > cursor.end:
            if body.ranged:
                next(body.chunks, None)
            return


class _Transfer:
    """One object's download: part 0 in the caller's thread, the rest in the store's pool."""

    def __init__(self, store: RemoteStore, key: str, sink: Sink, expected_size: int | None):
        self.store, self.key, self.sink = store, key, sink
        self.expected_size = expected_size
        self.what = store._describe(key)
        self.part_size = store.options.part_size
        self.total: int | None = None
        self.etag: str | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        self._part(0, self.part_size - 1)
        assert self.total is not None
        futures: list[Future[None]] = [
            self.store._pool.get().submit(
                self._part, start, min(start + self.part_size, self.total) - 1
            )
            for start in range(self.part_size, self.total, self.part_size)
        ]
        if not futures:
            return
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in done if f.exception() is not None), None)
        if failed is not None:
            self.stop.set()  # the other parts stop at their next chunk
            for future in futures:
                future.cancel()
            wait(futures)
            raise failed.exception()  # type: ignore[misc]

    def _part(self, start: int, end: int) -> None:
        """Fetch bytes ``start..end``, resuming after cuts from the last byte received."""
        cursor = _Cursor(start, end)
        backoff = Backoff(self.store.options, self.what)
        while cursor.offset <= cursor.end and not self.stop.is_set():
            attempt_start = cursor.offset
            try:
                with self.store._slots.get().slot() as sent:
                    self._fetch(cursor)
                    sent(cursor.offset - attempt_start)
                if cursor.offset <= cursor.end and not self.stop.is_set():
                    raise TransientStorageError(
                        f"{self.what}: response ended at byte {cursor.offset}, "
                        f"expected up to {cursor.end}"
                    )
            except TransientStorageError as exc:
                backoff.failed(exc, progressed=cursor.offset > attempt_start)

    def _fetch(self, cursor: _Cursor) -> None:
        """One GET from ``cursor.offset``; advances the cursor past every byte written."""
        body = self.store._get_range(self.key, cursor.offset, cursor.end, self.etag)
        try:
            if self.total is None:
                self._first_response(body)
                if not body.ranged:
                    # No range support: splitting would fetch the whole object per part,
                    # so this one response carries everything.
                    self.part_size = cursor.end = max(body.total_size, 1)
            elif body.total_size != self.total:
                raise StorageError(f"{self.what} changed size while downloading; retry later")
            cursor.end = min(cursor.end, body.total_size - 1)
            for data in _wanted(body, cursor):
                self._write(cursor.offset, data)
                cursor.offset += len(data)
                if self.stop.is_set():
                    break
        finally:
            body.close()

    def _first_response(self, body: RangeBody) -> None:
        check_size(body.total_size, self.expected_size, self.what)
        self.total, self.etag = body.total_size, body.etag
        try:
            self.sink.allocate(body.total_size)
        except OSError as exc:
            raise StorageError(f"{self.what}: cannot write: {exc.strerror or exc}") from exc

    def _write(self, offset: int, data: bytes) -> None:
        try:
            self.sink.write(offset, data)
        except OSError as exc:
            raise StorageError(f"{self.what}: cannot write: {exc.strerror or exc}") from exc
