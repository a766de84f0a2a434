"""``open_store``: pick the backend from a URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from shardstream.errors import ConfigError

from ._base import ObjectStore
from ._http import HTTPStore
from ._local import LocalStore
from ._options import StorageOptions
from ._s3 import S3Store


def open_store(url: str | Path, options: StorageOptions | None = None) -> ObjectStore:
    """The store for ``url``.

    ==============================  ============================================
    ``s3://bucket/prefix``          :class:`S3Store` (endpoint etc. from options / AWS_*)
    ``file:///abs/dir``             :class:`LocalStore`
    ``/abs/dir``, ``rel/dir``       :class:`LocalStore` (relative to the cwd)
    ``https://host/prefix``         :class:`HTTPStore` reading ``https://host/prefix/<key>``
    ==============================  ============================================

    >>> open_store("s3://my-bucket/datasets/v1")  # doctest: +SKIP
    S3Store('s3://my-bucket/datasets/v1')
    """
    if isinstance(url, Path):
        return LocalStore(url)
    if not isinstance(url, str) or not url:
        raise ConfigError(f"storage URL must be a non-empty string, got {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        if not parts.netloc:
            raise ConfigError(f"storage URL {url!r} names no bucket; use s3://BUCKET/prefix")
        if parts.query or parts.fragment:
            raise ConfigError(f"storage URL {url!r}: s3:// URLs take no '?' or '#' part")
        return S3Store(parts.netloc, parts.path.strip("/"), options)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(
                f"storage URL {url!r}: file URLs must be local (file:///abs/dir), "
                f"not on host {parts.netloc!r}"
            )
        return LocalStore(unquote(parts.path))
    if scheme in ("http", "https"):
        return HTTPStore.from_base_url(url, options)
    # A one-letter "scheme" is a Windows drive letter, anything without '://' a path.
    if scheme and "://" in url and len(scheme) > 1:
        raise ConfigError(
            f"storage URL {url!r}: unknown scheme {scheme!r}; use s3://, file://, "
            "http(s):// or a directory path"
        )
    return LocalStore(url)
