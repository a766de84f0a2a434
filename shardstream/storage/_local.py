"""``LocalStore``: a directory on a local (or network-mounted) filesystem."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from shardstream.errors import StorageError

from ._base import (
    TEMP_PREFIX,
    ObjectStore,
    StoreCapabilities,
    check_range,
    check_size,
    finish_download,
    temp_path_for,
)
from ._errors import storage_errors
from ._keys import check_key, check_prefix


class LocalStore(ObjectStore):
    """Objects are files under ``root``; key ``a/b.bin`` is ``root/a/b.bin``.

    Every write goes to a temp file in the target directory, is fsynced, and is renamed
    into place with ``os.replace``, so readers never see a partial file.

    >>> store = LocalStore("/data/shards")   # doctest: +SKIP
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    @property
    def capabilities(self) -> StoreCapabilities:
        """Local file reads under :attr:`root`; no presigning, no connections."""
        return StoreCapabilities(local_root=self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _describe(self, key: str) -> str:
        return self.url(key)

    def read_bytes(self, key: str) -> bytes:
        """The file's bytes; :class:`ObjectNotFoundError` if missing."""
        path = self._path(key)
        with storage_errors(self._describe(key)):
            return path.read_bytes()

    def read_range(
        self, key: str, start: int, end: int, *, expected_size: int | None = None
    ) -> bytes | bytearray:
        """``pread`` of bytes ``start .. end - 1``."""
        path, what = self._path(key), self._describe(key)
        if not 0 <= start <= end:
            raise StorageError(f"{what}: invalid byte range {start}..{end}")
        with storage_errors(what), open(path, "rb") as fh:
            check_size(os.fstat(fh.fileno()).st_size, expected_size, what)
            data = os.pread(fh.fileno(), end - start, start)
        return check_range(data, start, end, what)

    def download(
        self,
        key: str,
        dest: Path,
        *,
        expected_size: int | None = None,
        expected_hashes: Mapping[str, str] | None = None,
    ) -> None:
        """Copy to a temp file beside ``dest``, verify, rename."""
        src, what = self._path(key), self._describe(key)
        tmp = temp_path_for(dest)
        with storage_errors(what):
            try:
                shutil.copyfile(src, tmp)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                raise
        finish_download(
            tmp, dest, what=what, expected_size=expected_size, expected_hashes=expected_hashes
        )

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` atomically (temp file, fsync, rename)."""
        path = self._path(key)
        with storage_errors(self._describe(key)):
            self._replace(path, lambda fh: fh.write(data))

    def upload(self, src: Path, key: str) -> None:
        """Copy ``src`` in atomically."""
        path = self._path(key)
        with storage_errors(self._describe(key)), open(src, "rb") as in_fh:
            self._replace(path, lambda fh: shutil.copyfileobj(in_fh, fh, 8 << 20))

    @staticmethod
    def _replace(path: Path, fill: Callable[[BinaryIO], object]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(path)
        try:
            with open(tmp, "xb") as fh:
                fill(fh)
                fh.flush()
                # Without fsync a crash right after the rename can leave an empty file
                # under the final name on some filesystems.
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise

    def size(self, key: str) -> int | None:
        """File size, or ``None`` if it does not exist."""
        path = self._path(key)
        with storage_errors(self._describe(key)):
            try:
                return path.stat().st_size if path.is_file() else None
            except FileNotFoundError:
                return None

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every file under the root whose key starts with ``prefix``, sorted by key."""
        check_prefix(prefix)
        # Walk only the deepest directory the prefix names, not the whole tree.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root.joinpath(*base.split("/")) if base else self.root
        found: list[tuple[str, int]] = []
        with storage_errors(f"{self.url()} (listing {prefix!r})"):
            for dirpath, _dirs, files in os.walk(top):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    if name.startswith(TEMP_PREFIX):
                        continue
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                            found.append((key, os.stat(os.path.join(dirpath, name)).st_size))
        yield from sorted(found)

    def delete(self, key: str) -> None:
        """Remove the file (no error if it is missing)."""
        path = self._path(key)
        with storage_errors(self._describe(key)), contextlib.suppress(FileNotFoundError):
            path.unlink()

    def url(self, key: str = "") -> str:
        """``file:///abs/root/key``."""
        if not key:
            return self.root.as_uri()
        return self.root.joinpath(*check_key(key).split("/")).as_uri()
