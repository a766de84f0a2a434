"""The server's view of object storage: publish checks and presigned URLs.

Stores are opened once per storage root and cached (a boto3 client costs tens of
milliseconds to build). All storage access goes through :mod:`shardstream.storage`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from shardstream.errors import ConflictError, RequestValidationError, StorageError

if TYPE_CHECKING:
    from shardstream.storage import ObjectStore

# Below this many shards, one size() per shard beats listing the whole root.
_LIST_THRESHOLD = 64
_MAX_PROBLEMS = 5


class StoreCache:
    """Open stores by root URL, thread-safe, at most ``capacity`` at a time."""

    def __init__(self, capacity: int = 64, *, public_endpoint_url: str | None = None) -> None:
        self._stores: dict[tuple[str, bool], ObjectStore] = {}
        self._lock = threading.Lock()
        self._capacity = capacity
        self._public_endpoint_url = public_endpoint_url

    def get(self, root: str, *, for_clients: bool = False) -> ObjectStore:
        """The store for ``root`` (opened on first use).

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

        options = StorageOptions(endpoint_url=self._public_endpoint_url) if public else None
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


def verify_shards(store: ObjectStore, shards: Iterable[tuple[str, int]], count: int) -> None:
    """Raise 409 unless every ``(key, size)`` exists in ``store`` with exactly that size.

    Small versions ask for each object's size; large ones list the root once, so a
    100k-shard version costs ~100 list calls instead of 100k HEAD requests.
    """
    problems: list[str] = []
    listed: dict[str, int] | None = None
    if count > _LIST_THRESHOLD:
        listed = dict(store.list(""))
    for key, size in shards:
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


def presign(store: ObjectStore, keys: list[str], expires_s: int) -> dict[str, str]:
    """GET URLs for ``keys``: presigned for S3, plain ``file://``/``https://`` otherwise."""
    presign_get = getattr(store, "presign_get", None)
    if presign_get is not None:
        return {key: str(presign_get(key, expires_s)) for key in keys}
    return {key: store.url(key) for key in keys}
