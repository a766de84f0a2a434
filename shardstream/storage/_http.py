"""``HTTPStore``: reading objects over HTTP(S), typically presigned URLs from the server.

Training nodes need no bucket credentials: a resolver (usually the metadata server's
presign endpoint) maps keys to URLs, in batches. URLs are cached until shortly before
they expire, and re-resolved when the store answers 403 (or 400 "expired") anyway, e.g.
because of clock skew or a revoked signing key.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import httpx

from shardstream.errors import ObjectNotFoundError, ShardstreamError, StorageError

from ._base import StoreCapabilities
from ._errors import error_for_status, retry_after, storage_errors
from ._keys import check_key
from ._options import StorageOptions
from ._retry import retrying
from ._transfer import ForkLocal, RangeBody, RemoteStore

log = logging.getLogger("shardstream.storage")

Resolver = Callable[[list[str]], Mapping[str, str]]
"""Maps a batch of keys to URLs (it may return more keys than asked, never fewer)."""

_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+)")
_S3_CODE = re.compile(rb"<Code>([^<]+)</Code>")


class HTTPStore(RemoteStore):
    """Read-only store over HTTP(S) GET with ranged, parallel, resumable downloads.

    >>> store = HTTPStore(lambda keys: api.presign(keys))                    # doctest: +SKIP
    >>> store.resolve_urls(["shard.00000.mds", "shard.00001.mds"])  # one batch # doctest: +SKIP
    >>> store.download("shard.00000.mds", Path("/cache/s0"), expected_hashes=h)  # doctest: +SKIP
    """

    def __init__(
        self,
        resolve: Resolver,
        *,
        options: StorageOptions | None = None,
        batch_size: int = 256,
        name: str = "presigned URLs",
    ) -> None:
        super().__init__(options or StorageOptions())
        self._resolve = resolve
        self.batch_size = batch_size
        self.name = name
        self._urls: dict[str, tuple[str, float | None]] = {}
        self._lock = threading.Lock()
        self._http = ForkLocal(self._new_client)
        self._renewing = False

    @classmethod
    def from_base_url(cls, base_url: str, options: StorageOptions | None = None) -> HTTPStore:
        """A store whose key ``k`` is simply ``base_url/k`` (public HTTP(S) datasets)."""
        base = base_url.rstrip("/")
        return cls(lambda keys: {k: f"{base}/{quote(k)}" for k in keys}, options=options, name=base)

    def __repr__(self) -> str:
        return f"HTTPStore({self.name!r})"

    @property
    def capabilities(self) -> StoreCapabilities:
        """Remote reads through the process's adaptive limit; it cannot presign (its URLs
        are already presigned, by whoever resolves them)."""
        return self._remote_capabilities(presigns=False)

    def _new_client(self) -> httpx.Client:
        return shared_client(self.options)  # released by close()

    # -- URL resolution -------------------------------------------------------------------

    def resolve_urls(self, keys: Iterable[str]) -> None:
        """Resolve every key that has no fresh URL yet, ``batch_size`` keys per resolver call."""
        self._resolve_missing(keys)

    def _resolve_missing(self, keys: Iterable[str]) -> dict[str, str]:
        resolved: dict[str, str] = {}
        with self._lock:
            missing = [check_key(k) for k in dict.fromkeys(keys) if not self._fresh(k)]
        for i in range(0, len(missing), self.batch_size):
            batch = missing[i : i + self.batch_size]
            try:
                urls = dict(self._resolve(batch))
            except ShardstreamError:
                raise
            except Exception as exc:
                raise StorageError(
                    f"{self.name}: resolving URLs for {batch[0]!r}...: {exc}"
                ) from exc
            for key in batch:
                if key not in urls:
                    raise StorageError(f"{self.name}: the resolver returned no URL for {key!r}")
            with self._lock:
                self._urls.update((k, (u, _expires_at(u))) for k, u in urls.items())
            resolved.update(urls)
        return resolved

    def _fresh(self, key: str) -> bool:
        entry = self._urls.get(key)
        return entry is not None and (entry[1] is None or time.time() < entry[1])

    def _url(self, key: str) -> str:
        with self._lock:
            if self._fresh(key):
                url, expires = self._urls[key]
                if expires is not None and not self._renewing and _due(url, expires):
                    self._renewing = True
                    threading.Thread(
                        target=self._renew, name="shardstream-presign", daemon=True
                    ).start()
                return url
        resolved = self._resolve_missing([key])
        if key in resolved:
            return resolved[key]
        with self._lock:  # another thread resolved it meanwhile
            return self._urls[key][0]

    def _renew(self) -> None:
        """Re-resolve, in the background, every URL in the last quarter of its life, so
        reads keep using the old (still valid) URLs and never wait for the resolver."""
        try:
            with self._lock:
                due = [k for k, (u, e) in self._urls.items() if e is not None and _due(u, e)]
            fresh: dict[str, tuple[str, float | None]] = {}
            for i in range(0, len(due), self.batch_size):
                urls = dict(self._resolve(due[i : i + self.batch_size]))
                fresh.update((k, (u, _expires_at(u))) for k, u in urls.items())
            with self._lock:
                self._urls.update(fresh)
        except Exception as exc:  # the old URLs still work; the next read retries
            log.warning("%s: renewing presigned URLs failed: %s", self.name, exc)
        finally:
            self._renewing = False

    def _refresh(self, key: str, stale: str) -> str:
        """Drop ``stale`` (unless another thread replaced it already) and resolve again."""
        with self._lock:
            if self._urls.get(key, ("",))[0] == stale:
                del self._urls[key]
        return self._url(key)

    def _describe(self, key: str) -> str:
        entry = self._urls.get(key)
        if entry is None:
            return f"{key!r} from {self.name}"
        parts = urlsplit(entry[0])  # without the query: it holds the signature
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))

    # -- reading --------------------------------------------------------------------------

    def _get_range(self, key: str, start: int, end: int, etag: str | None) -> RangeBody:
        url = self._url(key)
        headers = {"Range": f"bytes={start}-{end}"}
        if etag:
            headers["If-Match"] = etag
        for attempt in range(2):
            what = self._describe(key)
            client = self._http.get()
            with storage_errors(what):
                resp = client.send(client.build_request("GET", url, headers=headers), stream=True)
            if resp.status_code in (200, 206):
                return self._body(resp, what)
            with storage_errors(what):
                payload = resp.read()
            resp.close()
            expired = resp.status_code == 403 or (resp.status_code == 400 and b"xpire" in payload)
            if expired and attempt == 0:
                url = self._refresh(key, url)
                continue
            if resp.status_code == 416:
                match = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", ""))
                if match and match.group(2) == "0":
                    return RangeBody(0, 0, etag, iter(()), lambda: None)
            if resp.status_code == 412:
                raise StorageError(f"{what} was replaced while downloading; retry")
            code = _S3_CODE.search(payload)
            raise error_for_status(
                resp.status_code,
                code.group(1).decode() if code else "",
                what,
                denied_hint="the URL was refused even freshly resolved; check that the token "
                "behind the resolver may read this dataset",
                retry_after_s=retry_after(resp.headers.get("retry-after")),
            )
        raise AssertionError("unreachable")

    def _body(self, resp: httpx.Response, what: str) -> RangeBody:
        match = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", ""))
        if resp.status_code == 206 and match and match.group(1) is not None:
            first, total = int(match.group(1)), int(match.group(2))
        elif resp.status_code == 200 and "content-length" in resp.headers:
            first, total = 0, int(resp.headers["content-length"])
        else:
            resp.close()
            raise StorageError(f"{what}: response has no usable Content-Range/Content-Length")
        etag, chunks = resp.headers.get("etag"), _chunks(resp, what)
        return RangeBody(first, total, etag, chunks, resp.close, ranged=resp.status_code == 206)

    def size(self, key: str) -> int | None:
        """The object's size from a one-byte ranged GET (presigned URLs allow only GET)."""
        what = self._describe(check_key(key))
        try:
            body = retrying(self.options, what, lambda: self._get_range(key, 0, 0, None))
        except ObjectNotFoundError:
            return None
        body.close()
        return body.total_size

    def url(self, key: str = "") -> str:
        """The (resolved, possibly presigned) URL of ``key``."""
        return self._url(check_key(key)) if key else self.name

    def close(self) -> None:
        """Release this store's threads and its use of the process's shared connection
        pool, which closes (with its idle connections) once no open store uses it."""
        client = self._http.built()
        self._http.reset()
        if client is not None:
            release_client(client)
        super().close()

    # -- the write side does not exist here -----------------------------------------------

    def _read_only(self, op: str, key: str) -> StorageError:
        return StorageError(
            f"{self.name}: cannot {op} {key!r}: HTTPStore is read-only; write through an "
            "s3:// or local store instead"
        )

    def write_bytes(self, key: str, data: bytes) -> None:
        """Not supported: raises :class:`StorageError`."""
        raise self._read_only("write", key)

    def upload(self, src: Path, key: str) -> None:
        """Not supported: raises :class:`StorageError`."""
        raise self._read_only("upload", key)

    def delete(self, key: str) -> None:
        """Not supported: raises :class:`StorageError`."""
        raise self._read_only("delete", key)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Not supported (HTTP has no listing): raises :class:`StorageError`."""
        raise self._read_only("list", prefix)


def _chunks(resp: httpx.Response, what: str) -> Iterator[bytes]:
    with storage_errors(what):
        # No chunk size: bytes are handed on as they arrive, so a cut loses none of them.
        yield from resp.iter_bytes()


_CLIENTS: dict[tuple[int, float, float, int], httpx.Client] = {}
_USERS: dict[int, int] = {}
"""Open stores using each shared pool, by the pool's ``id``."""
_CLIENTS_LOCK = threading.Lock()


def shared_client(options: StorageOptions) -> httpx.Client:
    """The process's one HTTP connection pool for these timeouts (every HTTPStore of the
    process shares it: connections to the same host are reused across datasets).

    Each call counts a user until :func:`release_client`: the last release closes the
    pool and its idle connections (kept-alive connections to a server that went away
    would otherwise stay open as long as the process). A store dropped without
    ``close()`` keeps its pool open, to be shared with the process's later stores.
    """
    key = (os.getpid(), options.connect_timeout_s, options.read_timeout_s, options.max_connections)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None or client.is_closed:
            for stale in [k for k in _CLIENTS if k[0] != key[0]]:
                _USERS.pop(id(_CLIENTS.pop(stale)), None)  # the parent's: unused after a fork
            client = _CLIENTS[key] = httpx.Client(
                timeout=httpx.Timeout(options.read_timeout_s, connect=options.connect_timeout_s),
                limits=httpx.Limits(
                    max_connections=options.max_connections + 4,
                    max_keepalive_connections=options.max_connections + 4,
                ),
                follow_redirects=True,
            )
        _USERS[id(client)] = _USERS.get(id(client), 0) + 1
    return client


def release_client(client: httpx.Client) -> None:
    """A user of a :func:`shared_client` pool is done with it; the last one closes it."""
    with _CLIENTS_LOCK:
        users = _USERS.get(id(client), 0) - 1
        if users > 0:
            _USERS[id(client)] = users
            return
        _USERS.pop(id(client), None)
        for key in [k for k, c in _CLIENTS.items() if c is client]:
            del _CLIENTS[key]
    client.close()


def _due(url: str, expires: float) -> bool:
    """Whether a URL valid until ``expires`` is in the last quarter of its life."""
    lifetime = _lifetime(url)
    return lifetime is not None and time.time() > expires - 0.25 * lifetime


def _lifetime(url: str) -> float | None:
    query = parse_qs(urlsplit(url).query)
    try:
        return float(query["X-Amz-Expires"][0]) if "X-Amz-Expires" in query else None
    except ValueError:
        return None


def _expires_at(url: str) -> float | None:
    """When a presigned URL stops working, less a safety margin; ``None`` if unknown."""
    query = parse_qs(urlsplit(url).query)
    try:
        if "X-Amz-Date" in query and "X-Amz-Expires" in query:  # SigV4
            signed = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ")
            lifetime = float(query["X-Amz-Expires"][0])
            start = signed.replace(tzinfo=timezone.utc).timestamp()
        elif "Expires" in query:  # SigV2: an absolute time
            return float(query["Expires"][0]) - 5.0
        else:
            return None
    except ValueError:
        return None
    # Renew a little early so a download does not start on a URL about to die.
    return start + lifetime - min(30.0, 0.1 * lifetime)
