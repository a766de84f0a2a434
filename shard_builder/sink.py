"""Where finished shards go: a local directory, or an object store through a staging folder.

Shards are written by the MDS codec into a local folder: the output directory itself when
it is local (a rename puts each shard in place), or a temporary staging folder whose
shards are uploaded one at a time in a background thread (so encoding the next shard
overlaps the upload) and deleted after. ``after_store`` callbacks (the journal) run only
once a shard's bytes are safely stored, in shard order.
"""

from __future__ import annotations

import contextlib
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from shardstream.errors import ConfigError, ShardstreamError, StorageError
from shardstream.hashing import verify_file
from shardstream.mds import ShardInfo
from shardstream.storage import LocalStore, ObjectStore, open_store

INDEX_KEY = "index.json"
METADATA_KEY = "shardstream.json"
_SHARD_MODE = 0o644
_OURS = ("shard.", INDEX_KEY, METADATA_KEY, ".shardstream-build/")
# Shards of a build with ``spread_prefixes`` sit under a hashed folder: "1f0c/shard.00003.mds".
_SPREAD_SHARD = re.compile(r"[0-9a-f]{2,8}/shard\.")


def _is_ours(key: str) -> bool:
    """Whether ``key`` is a file a build writes (and ``--overwrite`` may delete)."""
    return key.startswith(_OURS) or _SPREAD_SHARD.match(key) is not None


def _is_shard(key: str) -> bool:
    return key.startswith("shard.") or _SPREAD_SHARD.match(key) is not None


def local_output_dir(output: str) -> Path | None:
    """The local directory ``output`` names, or ``None`` for an object-store URL."""
    parsed = urlparse(output)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # "C:" is a drive, not a scheme
        return None
    return Path(output)


class ShardSink:
    """The output of one build: a store plus the local folder shards are written into."""

    def __init__(self, output: str) -> None:
        local = local_output_dir(output)
        # The folders this build makes (deepest first): a failed build removes them again
        # when they are left empty (remove_created_dirs), never a folder that was there.
        self._created: list[Path] = []
        if local is not None:
            self._created = _missing_dirs(local.absolute())
            local.mkdir(parents=True, exist_ok=True)
            self.store: ObjectStore = LocalStore(local)
            self.staging = local.absolute()
            self._remote = False
            _sweep_temp_files(self.staging)
        else:
            self.store = open_store(output)
            self.staging = Path(tempfile.mkdtemp(prefix="shardstream-build-"))
            self._remote = True
        # At most two shards wait for upload: bounds the staging folder's disk use.
        self._queue: queue.Queue[tuple[ShardInfo, Callable[[], None]] | None] = queue.Queue(2)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The output's canonical URL."""
        return self.store.url()

    def check_empty(self, overwrite: bool = False) -> None:
        """Refuse an output that already holds files (deleting ours first if ``overwrite``)."""
        if overwrite:
            for key, _ in list(self.store.list()):
                if _is_ours(key):
                    self.store.delete(key)
        found = [key for key, _ in self.store.list() if not key.startswith(".shardstream-build/")]
        if found:
            raise ConfigError(
                f"output {self.url} is not empty (it holds {found[0]!r} and "
                f"{len(found) - 1} more); choose an empty output, or pass --overwrite to "
                "replace a dataset written there before"
            )

    def discard_partial(self) -> None:
        """Delete this build's shards and journal: the input is bad, a resume cannot help."""
        with contextlib.suppress(ShardstreamError):
            self.flush()
        for key, _ in list(self.store.list()):
            if _is_ours(key):
                self.store.delete(key)
        self.remove_local_dir(".shardstream-build")

    def remove_created_dirs(self) -> None:
        """After a failed build: remove the folders this sink made that hold nothing now
        (an empty output folder would look like a dataset being written); a folder that
        still holds something (an interrupted build's shards and journal, kept for a
        resume) stays, and so do its parents."""
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:  # not empty, or gone: the folders above it stay too
                return

    def discard_if_made_without_shards(self) -> None:
        """After a build stopped by anything but bad input: when this sink made the output
        folder and no shard was stored in it, nothing there can help a resume, so the
        journal and the folders go (a local output only)."""
        if not self._created:
            return
        with contextlib.suppress(ShardstreamError, OSError):
            if not any(_is_shard(key) for key, _ in self.store.list()):
                self.discard_partial()
                self.remove_created_dirs()

    def stored(self, info: ShardInfo, after_store: Callable[[], None]) -> None:
        """The codec has written ``info``'s file into :attr:`staging`: store it, then call back."""
        self._raise_pending()
        if not self._remote:
            # The codec's temp files are created 0600; a dataset should be readable like
            # any file the user writes.
            (self.staging / info.stored.basename).chmod(_SHARD_MODE)
            after_store()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._upload_loop, daemon=True)
            self._thread.start()
        self._queue.put((info, after_store))

    def _upload_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            info, after_store = item
            if self._error is not None:
                continue  # drain: the main thread raises the first error
            path = self.staging / info.stored.basename
            try:
                self.store.upload(path, info.stored.basename)
                path.unlink()
                after_store()
            except BaseException as exc:
                self._error = exc

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, ShardstreamError):
                raise error
            raise StorageError(f"uploading a shard to {self.url} failed: {error}") from error

    def flush(self) -> None:
        """Wait until every shard handed to :meth:`stored` is stored; re-raise upload errors."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise_pending()

    def verify(self, info: ShardInfo) -> bool:
        """Whether the stored shard matches ``info`` (size; hash too when it is local)."""
        stored = info.stored
        if self.store.size(stored.basename) != stored.bytes:
            return False
        if self._remote:
            return True
        try:
            verify_file(self.staging / stored.basename, stored.hashes, what=stored.basename)
        except ShardstreamError:
            return False
        return True

    def remove_local_dir(self, folder: str) -> None:
        """Remove ``folder`` of a local output with whatever is left in it (temp files)."""
        if not self._remote:
            shutil.rmtree(self.staging / folder, ignore_errors=True)

    def close(self) -> None:
        """Stop the upload thread and remove the staging folder (remote outputs)."""
        with contextlib.suppress(ShardstreamError):
            self.flush()
        if self._remote:
            shutil.rmtree(self.staging, ignore_errors=True)


def _missing_dirs(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _sweep_temp_files(folder: Path) -> None:
    # The codec writes ".<name>.<random>.tmp" before its rename; a killed build leaves them.
    for pattern in (".shard.*.tmp", "*/.shard.*.tmp"):  # "*/": under spread prefixes
        for path in folder.glob(pattern):
            path.unlink(missing_ok=True)
    for path in folder.glob(".index.json.*.tmp"):
        path.unlink(missing_ok=True)
