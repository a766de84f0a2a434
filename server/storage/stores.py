"""The server's view of object storage: publish checks and presigned URLs.

Stores are opened once per storage root and cached (a boto3 client costs tens of
milliseconds to build). All storage access goes through :mod:`shardstream.storage`.

The server only ever opens a version's storage root after :func:`confined_root` found
it inside a configured storage root, and only ever touches the version's own keys in
it. Every call has connect and read timeouts (:data:`SERVER_STORAGE`), and a publish's
whole check has a deadline (:func:`verify_within`) and runs in a thread of its own (a
few at most), so a slow or dripping storage host can hold neither a database
connection nor the request threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from shardstream.errors import (
    ConflictError,
    RequestValidationError,
    ServerUnavailableError,
    StorageError,
)
from shardstream.server.storage.locations import (
    Location,
    LocationError,
    inside_roots,
    parse_location,
)

if TYPE_CHECKING:
    from shardstream.storage import ObjectStore

# Below this many shards, one size() per shard beats listing the whole root.
_LIST_THRESHOLD = 64
_MAX_PROBLEMS = 5
# Timeouts of every storage request the server makes; few quick retries, since the
# caller of a publish is waiting (and retries it) and presigning makes no request.
SERVER_STORAGE: dict[str, Any] = {
    "connect_timeout_s": 5.0,
    "read_timeout_s": 10.0,
    "retries": 3,
    "backoff_max_s": 2.0,
}
# Publish checks in flight (or abandoned at their deadline and still finishing a call).
VERIFY_THREADS = 8


class StoreCache:
    """Open stores by root URL, thread-safe, at most ``capacity`` at a time."""

    def __init__(self, capacity: int = 64, *, public_endpoint_url: str | None = None) -> None:
        self._stores: dict[tuple[str, bool], ObjectStore] = {}
        self._lock = threading.Lock()
        self._capacity = capacity
        self._public_endpoint_url = public_endpoint_url
        self.check_threads = VERIFY_THREADS  # see verify_within
        self.checks = threading.BoundedSemaphore(VERIFY_THREADS)

    def get(self, root: str, *, for_clients: bool = False) -> ObjectStore:
        """The store for ``root`` (opened on first use); check it with :func:`confined_root`.

        ``for_clients``: the store whose presigned URLs clients can use -- for S3 roots
        with ``SHARDSTREAM_S3_PUBLIC_ENDPOINT_URL`` set, one signing for that endpoint
        (a signature covers the host, so it cannot be rewritten afterwards).
        """
        public = for_clients and self._public_endpoint_url is not None and root.startswith("s3://")
        with self._lock:
            store = self._stores.get((root, public))
            if store is not None:
                return store
        from shardstream.storage import StorageOptions, open_store  # boto3: import lazily

        endpoint = self._public_endpoint_url if public else None
        options = StorageOptions(endpoint_url=endpoint, **SERVER_STORAGE)
        try:
            store = open_store(root, options)
        except StorageError:
            raise
        except ValueError as exc:
            raise RequestValidationError(f"storage_root {root!r}: {exc}", 422) from exc
        with self._lock:
            if len(self._stores) >= self._capacity:
                self._stores.pop(next(iter(self._stores)))
            self._stores[(root, public)] = store
        return store


def confined_root(root: str, roots: tuple[Location, ...], what: str) -> str:
    """``root`` (a version's storage root) if it lies inside a configured root, else 409.

    Rows written before storage roots were confined (or under a root an operator has
    since removed) are refused here, so no stored string can reach other objects.
    """
    try:
        location = parse_location(root)
    except LocationError:
        location = None
    if location is None or location.url != root or inside_roots(location, roots) is None:
        raise ConflictError(
            f"{what} is stored at {root}, outside the server's storage roots; an operator "
            "must add its root to SHARDSTREAM_STORAGE_ROOTS before it can be served",
            409,
        )
    return root


class _Progress:
    """What a running check is doing, for the message when it runs out of time."""

    def __init__(self) -> None:
        self.current = "listing the version's storage root"
        self.cancelled = threading.Event()


def verify_shards(
    store: ObjectStore,
    shards: Iterable[tuple[str, int]],
    count: int,
    progress: _Progress | None = None,
) -> None:
    """Raise 409 unless every ``(key, size)`` exists in ``store`` with exactly that size.

    Small versions ask for each object's size; large ones list the root once, so a
    100k-shard version costs ~100 list calls instead of 100k HEAD requests. Only the
    version's own keys are named in errors (its root holds nothing else of interest).
    """
    progress = progress or _Progress()
    problems: list[str] = []
    listed: dict[str, int] | None = None
    if count > _LIST_THRESHOLD:
        listed = {}
        for key, size in store.list(""):
            if progress.cancelled.is_set():
                return
            listed[key] = size
    inside = _inside_local_root(store)
    for key, size in shards:
        if progress.cancelled.is_set():
            return
        progress.current = f"checking shard {key!r}"
        if not inside(key):
            problems.append(f"shard {key!r} is a link that leaves the version's storage root")
            continue
        actual = listed.get(key) if listed is not None else store.size(key)
        if actual is None:
            problems.append(f"shard {key!r} is missing from {store.url(key)}")
        elif actual != size:
            problems.append(
                f"shard {key!r} has {actual} bytes in storage but was registered with {size}"
            )
        if len(problems) >= _MAX_PROBLEMS:
            break
    if problems:
        raise ConflictError(
            "cannot publish: " + "; ".join(problems) + ". Upload the shards (or fix the "
            "registered sizes in a new draft) and publish again",
            409,
        )


def _inside_local_root(store: ObjectStore) -> Callable[[str], bool]:
    """For a local store, whether a key's file really is under the root (no symlink out
    of it, whose target's size an error would reveal); always true for other stores."""
    root = store.capabilities.local_root
    if root is None:
        return lambda _key: True
    real_root = os.path.realpath(root)

    def inside(key: str) -> bool:
        real = os.path.realpath(root.joinpath(*key.split("/")))
        return real.startswith(real_root + os.sep)

    return inside


async def verify_within(
    stores: StoreCache,
    store: ObjectStore,
    shards: list[tuple[str, int]],
    deadline_s: float,
    what: str,
) -> None:
    """:func:`verify_shards` in a thread of its own, given up after ``deadline_s`` (504).

    A check past its deadline is told to stop and abandoned; its thread (a daemon, so it
    never delays shutdown) finishes the one storage call it is in. At most
    :data:`VERIFY_THREADS` checks run at once, abandoned ones included: beyond that a
    publish is a 503 at once rather than a thread more for a store that does not answer.
    """
    if not stores.checks.acquire(blocking=False):
        raise ServerUnavailableError(
            f"cannot publish {what} now: {stores.check_threads} publishes are already checking "
            "storage (it may be slow to answer); publish again later",
            503,
        )
    progress = _Progress()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    def check() -> None:
        error: BaseException | None = None
        try:
            verify_shards(store, shards, len(shards), progress)
        except BaseException as exc:
            error = exc
        finally:
            stores.checks.release()
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
            loop.call_soon_threadsafe(settle, error)

    threading.Thread(target=check, name="publish-check", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(done), deadline_s)
    except TimeoutError:
        progress.cancelled.set()
        done.add_done_callback(_ignore_result)
        raise ServerUnavailableError(
            f"cannot publish {what}: storage did not answer within {deadline_s:g} s "
            f"(SHARDSTREAM_STORAGE_DEADLINE_S) while {progress.current}; publish again later",
            504,
        ) from None


def _ignore_result(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not log it as never retrieved


def presign(store: ObjectStore, keys: list[str], expires_s: int) -> dict[str, str]:
    """GET URLs for ``keys``: presigned for S3, plain ``file://`` URLs for local roots."""
    if store.capabilities.presigns:
        return {key: store.presign_get(key, expires_s) for key in keys}
    return {key: store.url(key) for key in keys}
