"""Storage locations: where the server lets a dataset's bytes live.

The operator configures storage roots (``SHARDSTREAM_STORAGE_ROOT`` and
``SHARDSTREAM_STORAGE_ROOTS``). Every dataset gets one location under a root, derived
from server-held identity (``<root>/<name>-<random id>``), and a version's shards live
under ``<location>/v<N>``. Clients never choose a location: only an admin may register
an existing dataset in place, and only strictly inside a configured root. So that no
string from a request can reach outside, every location is parsed into a
:class:`Location` (scheme, bucket, path segments), percent-encoding decoded once and
``.``/``..``/empty segments refused, and containment is compared segment by segment.

Only ``s3://`` and ``file://`` locations exist: the server never fetches an ``http(s)``
URL of anyone's choosing.

>>> root = parse_location("s3://bucket/teams")
>>> root.contains(parse_location("s3://bucket/teams/wiki-1f2e/v1"))
True
>>> root.contains(parse_location("s3://bucket/teams2/x"))
False
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import quote, unquote, urlsplit

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# Characters a segment never needs and that mean something to URLs, paths or shells.
_FORBIDDEN = set("\\?#%\x7f") | {chr(c) for c in range(32)}


class LocationError(ValueError):
    """A storage location (or shard key) that the server will not use; the message says why."""


@dataclass(frozen=True)
class Location:
    """A parsed storage location: ``s3://bucket/a/b`` or ``file:///a/b``."""

    scheme: str  # "s3" or "file"
    bucket: str  # the S3 bucket; "" for local directories
    parts: tuple[str, ...]  # path segments, never empty, "." or ".."

    @property
    def url(self) -> str:
        """The canonical URL (what is stored in the database and opened as a store)."""
        if self.scheme == "s3":
            path = "/".join(self.parts)
            return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"
        return PurePosixPath("/", *self.parts).as_uri()

    def contains(self, other: Location) -> bool:
        """Whether ``other`` is this location or inside it (on segment boundaries)."""
        return (
            self.scheme == other.scheme
            and self.bucket == other.bucket
            and other.parts[: len(self.parts)] == self.parts
        )

    def overlaps(self, other: Location) -> bool:
        """Whether either location contains the other."""
        return self.contains(other) or other.contains(self)

    def child(self, *segments: str) -> Location:
        """A location below this one (each segment checked)."""
        for segment in segments:
            _check_segment(segment, segment)
        return Location(self.scheme, self.bucket, self.parts + segments)


def parse_location(text: str) -> Location:
    """Parse ``s3://bucket/prefix``, ``file:///abs/dir`` or ``/abs/dir``, or raise.

    Percent-encoding is decoded once (``%2e%2e`` is ``..``) and the decoded segments are
    checked; a ``%`` left after decoding (double encoding) is refused rather than guessed.
    """
    try:
        return _parse(text)
    except LocationError:
        raise
    except ValueError as exc:  # urlsplit, ports, invalid UTF-8 after decoding, surrogates
        raise LocationError(f"it is not a valid URL ({exc})") from exc


def _parse(text: str) -> Location:
    if not isinstance(text, str) or not text.strip():
        raise LocationError("it is empty")
    text = text.strip()
    if "\x00" in text or any(ord(c) < 32 or ord(c) == 0x7F for c in text):
        raise LocationError("it contains control characters")
    if "\\" in text:
        raise LocationError("it contains a backslash")
    text.encode("utf-8")  # lone surrogates: a UnicodeEncodeError (a ValueError)
    if text.startswith("/"):
        text = "file://" + text
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        raise LocationError(
            "http(s) locations are not allowed: the server never fetches URLs; use "
            "s3://bucket/prefix or a local directory"
        )
    if scheme not in ("s3", "file") or "://" not in text:
        raise LocationError("it is not a storage URL; use s3://bucket/prefix or /abs/dir")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise LocationError("it has a '?' or '#' part")
    if scheme == "s3":
        bucket = parts.netloc
        if parts.username or parts.password or parts.port or not _BUCKET.fullmatch(bucket):
            raise LocationError(f"{bucket!r} is not an S3 bucket name")
    else:
        if parts.netloc not in ("", "localhost"):
            raise LocationError("file URLs must be local (file:///abs/dir)")
        bucket = ""
    segments = tuple(s for s in unquote(parts.path, errors="strict").split("/"))
    # A leading "/" gives one empty segment, a trailing one another; inner ones are errors.
    inner = segments[1:] if segments and segments[0] == "" else segments
    if inner and inner[-1] == "":
        inner = inner[:-1]
    for segment in inner:
        _check_segment(segment, text)
    return Location(scheme, bucket, inner)


def _check_segment(segment: str, whole: str) -> None:
    if segment in ("", ".", ".."):
        raise LocationError(f"it has an empty, '.' or '..' path segment ({whole!r})")
    bad = next((c for c in segment if c in _FORBIDDEN), None)
    if bad is not None:
        raise LocationError(f"path segment {quote(segment)!r} contains {bad!r}")


def parse_roots(text: str) -> tuple[Location, ...]:
    """Comma-separated roots, each parsed; a root is never a bucket's or disk's top."""
    roots: list[Location] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        root = parse_location(item)
        if root.scheme == "file" and not root.parts:
            raise LocationError(f"{item!r}: the file system root cannot be a storage root")
        if root not in roots:
            roots.append(root)
    return tuple(roots)


def dataset_location(root: Location, name: str) -> Location:
    """A fresh location for dataset ``name`` under ``root``.

    The random suffix, not the row id, makes it unique: SQLite hands a deleted row's id
    out again, and a new dataset of the same name must not see the old one's objects.
    """
    return root.child(f"{name}-{secrets.token_hex(8)}")


def version_location(dataset: Location, number: int) -> Location:
    """Where version ``number`` of a dataset at ``dataset`` keeps its shards."""
    return dataset.child(f"v{number}")


def inside_roots(location: Location, roots: tuple[Location, ...]) -> Location | None:
    """The configured root that contains ``location``, or None."""
    return next((root for root in roots if root.contains(location)), None)


def check_shard_key(key: str) -> str | None:
    """Why ``key`` cannot be a shard key under a version's location (None: it can).

    Keys are relative, ``/``-separated, and stay under the version's location however
    they are decoded: no scheme, no leading ``/``, no backslash, NUL or control
    characters, no ``.``/``..``/empty segments, no ``%`` (so no encoded traversal).
    """
    if not key:
        return "it is empty"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode text"
    if "://" in key or key.lower().startswith(("s3:", "file:", "http:", "https:")):
        return "it is a URL; shard keys are relative to the version's storage location"
    if key.startswith("/"):
        return "it is absolute (starts with '/')"
    for part in key.split("/"):
        if part in ("", ".", ".."):
            return f"it has an empty, '.' or '..' path segment ({part!r})"
        bad = next((c for c in part if c in _FORBIDDEN), None)
        if bad is not None:
            return f"it contains {bad!r}"
    return None
