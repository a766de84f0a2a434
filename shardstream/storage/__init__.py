"""Object storage behind one small interface: S3 (boto3), presigned HTTP(S) URLs, local dirs.

>>> from shardstream.storage import open_store
>>> store = open_store("s3://bucket/datasets/v1")       # doctest: +SKIP
>>> store.download("shard.00000.mds", Path("/cache/shard.00000.mds"),
...                expected_size=134217728, expected_hashes={"xxh3_64": "..."})  # doctest: +SKIP

Errors are always :mod:`shardstream.errors` classes (``ObjectNotFoundError``,
``StoragePermissionError``, ``TransientStorageError``, ``StorageError``,
``HashMismatchError``); see docs/storage.md for backends, settings and the retry policy.
"""

from __future__ import annotations

from ._base import ObjectStore, StoreCapabilities
from ._http import HTTPStore, Resolver
from ._keys import check_key, spread_key
from ._local import LocalStore
from ._open import open_store
from ._options import StorageOptions
from ._s3 import S3Store
from ._transfer import storage_counters

__all__ = [
    "HTTPStore",
    "LocalStore",
    "ObjectStore",
    "Resolver",
    "S3Store",
    "StorageOptions",
    "StoreCapabilities",
    "check_key",
    "open_store",
    "spread_key",
    "storage_counters",
]
