"""``S3Store``: S3 and S3-compatible stores (MinIO, R2, moto...) through boto3."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.client
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import botocore.loaders
import botocore.session

from shardstream.errors import ConfigError, ObjectNotFoundError, StorageError

from ._base import StoreCapabilities
from ._errors import storage_errors
from ._keys import check_key, check_prefix, join_key
from ._options import S3_MAX_PARTS, S3_MIN_UPLOAD_PART, StorageOptions
from ._retry import retrying
from ._transfer import ForkLocal, RangeBody, RemoteStore

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
# Small reads: urllib3 drops the partial chunk of a cut connection, so this bounds what
# a resumed part fetches twice.
_CHUNK = 64 << 10
ReadAt = Callable[[int, int], bytes]


class S3Store(RemoteStore):
    """Objects under ``s3://bucket/prefix``.

    Endpoint, region and credentials come from ``options`` where set, else from the
    standard AWS settings (``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``,
    ``AWS_ACCESS_KEY_ID``..., profiles). botocore's own retries are off: this store
    retries every request itself (see :class:`StorageOptions`), so the attempt count
    and backoff are exactly what the options say.

    >>> store = S3Store("my-bucket", "datasets/v1")      # doctest: +SKIP
    >>> store.presign_get("index.json", expires_s=600)   # doctest: +SKIP
    'https://my-bucket.s3.amazonaws.com/datasets/v1/index.json?X-Amz-...'
    """

    def __init__(self, bucket: str, prefix: str = "", options: StorageOptions | None = None):
        super().__init__(options or StorageOptions())
        if not bucket or "/" in bucket:
            raise ConfigError(f"invalid S3 bucket name {bucket!r} (from s3://BUCKET/prefix)")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self._client = ForkLocal(self._new_client)

    def __repr__(self) -> str:
        return f"S3Store({self.url()!r})"

    @property
    def capabilities(self) -> StoreCapabilities:
        """Remote reads through the process's adaptive limit; presigns GET URLs."""
        return self._remote_capabilities(presigns=True)

    def close(self) -> None:
        """Close this process's connections and worker threads (rebuilt on next use)."""
        client = self._client.built()
        self._client.reset()
        if client is not None:
            client.close()
        super().close()

    def _new_client(self) -> Any:
        opts = self.options
        config = botocore.config.Config(
            connect_timeout=opts.connect_timeout_s,
            read_timeout=opts.read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            # SigV4 everywhere (presigned URLs would otherwise be SigV2 in some regions).
            signature_version="s3v4",
            # Part workers plus the callers' own first-part requests.
            max_pool_connections=opts.max_connections + 4,
            s3={"addressing_style": opts.addressing_style},
            # The default CRC checksums are not understood by every S3-compatible store;
            # integrity is covered by Content-MD5 on upload and the index hash on download.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        # A session per client: the default session is not safe to share across threads.
        session = boto3.session.Session(botocore_session=_botocore_session())
        with storage_errors(self.url()):
            return session.client(
                "s3",
                endpoint_url=opts.endpoint_url,
                region_name=opts.region,
                aws_access_key_id=opts.access_key_id,
                aws_secret_access_key=opts.secret_access_key,
                aws_session_token=opts.session_token,
                config=config,
            )

    def _s3_key(self, key: str) -> str:
        return join_key(self.prefix, check_key(key))

    def _describe(self, key: str) -> str:
        return self.url(key)

    def _call(self, what: str, method: str, **kwargs: Any) -> Any:
        """One S3 API call with our retries; errors translated."""

        def attempt() -> Any:
            with self._slots.get().slot(), storage_errors(what):
                return getattr(self._client.get(), method)(Bucket=self.bucket, **kwargs)

        return retrying(self.options, what, attempt)

    def _get_range(self, key: str, start: int, end: int, etag: str | None) -> RangeBody:
        what = self._describe(key)
        extra = {"IfMatch": etag} if etag else {}
        try:
            with storage_errors(what):
                resp = self._client.get().get_object(
                    Bucket=self.bucket, Key=self._s3_key(key), Range=f"bytes={start}-{end}", **extra
                )
        except StorageError as exc:
            code = _error_code(exc.__cause__)
            if code == "InvalidRange" and self.size(key) == 0:
                return RangeBody(0, 0, etag, iter(()), lambda: None)
            if code in ("PreconditionFailed", "412"):
                raise StorageError(f"{what} was replaced while downloading; retry") from exc
            raise
        match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange", "") or "")
        if match:
            first, total = int(match.group(1)), int(match.group(3))
        else:  # the server ignored Range and sent everything
            first, total = 0, int(resp["ContentLength"])
        body = resp["Body"]
        chunks = _chunks(body, what)
        return RangeBody(
            first,
            total,
            resp.get("ETag"),
            chunks,
            body.close,
            ranged=bool(match),
            readinto=_direct_reader(body, what),
        )

    def size(self, key: str) -> int | None:
        """``ContentLength`` from HEAD, or ``None`` if the object does not exist."""
        try:
            resp = self._call(self._describe(key), "head_object", Key=self._s3_key(key))
        except ObjectNotFoundError:
            return None
        return int(resp["ContentLength"])

    def write_bytes(self, key: str, data: bytes) -> None:
        """PUT ``data`` (multipart when larger than ``part_size``)."""
        view = memoryview(data)
        self._put(key, len(data), lambda offset, n: bytes(view[offset : offset + n]))

    def upload(self, src: Path, key: str) -> None:
        """PUT the file, as a parallel multipart upload when larger than ``part_size``."""
        what = self._describe(key)
        try:
            fd = os.open(src, os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"cannot upload {src} to {what}: {exc.strerror or exc}") from exc
        try:
            self._put(key, os.fstat(fd).st_size, lambda offset, n: os.pread(fd, n, offset))
        finally:
            os.close(fd)

    def _put(self, key: str, size: int, read_at: ReadAt) -> None:
        s3_key, what = self._s3_key(key), self._describe(key)
        if size <= max(self.options.part_size, S3_MIN_UPLOAD_PART):
            data = read_at(0, size)
            self._call(what, "put_object", Key=s3_key, Body=data, ContentMD5=_md5(data))
        else:
            self._multipart(s3_key, what, size, read_at)

    def _multipart(self, s3_key: str, what: str, size: int, read_at: ReadAt) -> None:
        """Parts uploaded in parallel, each retried alone; aborted if anything fails."""
        part = max(self.options.part_size, S3_MIN_UPLOAD_PART, -(-size // S3_MAX_PARTS))
        upload_id = self._call(what, "create_multipart_upload", Key=s3_key)["UploadId"]

        def send(number: int) -> dict[str, Any]:
            offset = (number - 1) * part
            data = read_at(offset, min(part, size - offset))
            resp = self._call(
                f"{what} (part {number})",
                "upload_part",
                Key=s3_key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=_md5(data),
            )
            return {"PartNumber": number, "ETag": resp["ETag"]}

        futures: list[Future[dict[str, Any]]] = []
        try:
            pool = self._pool.get()
            futures = [pool.submit(send, n) for n in range(1, -(-size // part) + 1)]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failure = next((f.exception() for f in done if f.exception() is not None), None)
            if failure is not None:
                raise failure
            parts = [f.result() for f in futures]
            try:
                self._call(
                    what,
                    "complete_multipart_upload",
                    Key=s3_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except ObjectNotFoundError:
                # A retry after a completion whose response was lost finds no upload.
                head = self._call(what, "head_object", Key=s3_key)
                if int(head["ContentLength"]) != size:
                    raise
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)
            with contextlib.suppress(StorageError):
                # Best effort: the upload failed anyway, and a bucket lifecycle rule
                # removes stray uploads if this does not get through.
                self._call(what, "abort_multipart_upload", Key=s3_key, UploadId=upload_id)
            raise

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """``(key, size)`` under ``prefix``, page by page (each page retried)."""
        check_prefix(prefix)
        # The store's prefix is a folder: "data" must not also list "data2/...".
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        what = f"{self.url()} (listing {prefix!r})"
        kwargs: dict[str, Any] = {"Prefix": full}
        strip = len(self.prefix) + 1 if self.prefix else 0
        while True:
            page = self._call(what, "list_objects_v2", **kwargs)
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:], int(obj["Size"])
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        """DELETE the object (S3 does not mind a missing key)."""
        self._call(self._describe(key), "delete_object", Key=self._s3_key(key))

    def url(self, key: str = "") -> str:
        """``s3://bucket/prefix/key``."""
        path = join_key(self.prefix, check_key(key)) if key else self.prefix
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def presign_get(self, key: str, expires_s: int = 3600) -> str:
        """A URL anyone can GET for ``expires_s`` seconds (S3 allows at most 7 days)."""
        if not 1 <= expires_s <= 7 * 24 * 3600:
            raise ConfigError(f"presign_get: expires_s must be 1..604800, got {expires_s!r}")
        with storage_errors(self._describe(key)):
            url: str = self._client.get().generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self._s3_key(key)},
                ExpiresIn=expires_s,
            )
        return url


def _chunks(body: Any, what: str) -> Iterator[bytes]:
    with storage_errors(what):
        yield from body.iter_chunks(_CHUNK)


def _direct_reader(body: Any, what: str) -> Callable[[memoryview], int] | None:
    """``readinto`` straight from the response's socket file (``http.client``), bypassing
    urllib3's chunk objects and botocore's copy of each; ``None`` where the body is encoded
    or the client's internals are not the ones this was written against.

    The connection goes back to urllib3's pool once the body has been read to its end (as
    urllib3 does itself); a body cut short leaves it to ``close``, which drops it."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    release = getattr(raw, "release_conn", None)
    if not isinstance(fp, http.client.HTTPResponse) or release is None:
        return None
    if fp.getheader("content-encoding", "identity") != "identity":
        return None

    def readinto(view: memoryview) -> int:
        with storage_errors(what):
            got = fp.readinto(view)
        if fp.length == 0 and fp.isclosed():
            release()  # read to its end: the connection serves the next request
        return got

    return readinto


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _error_code(exc: BaseException | None) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


@functools.cache
def _shared_loader() -> botocore.loaders.Loader:
    return botocore.loaders.create_loader()


def _botocore_session() -> botocore.session.Session:
    """A fresh botocore session sharing this process's data loader: the S3 service model
    (~0.05 s of JSON per client) is parsed once per process, and a forked loader worker
    inherits it parsed. The loader only reads and caches bundled files."""
    session = botocore.session.get_session()
    session.register_component("data_loader", _shared_loader())
    return session
