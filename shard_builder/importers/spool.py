"""Handing a worker's encoded samples to the main process through a file, not a pipe.

A worker's result for one unit is tens of MB of encoded samples. Pickled through the
pool's pipe it would be copied four times (pickle, pipe write, pipe read, unpickle); as a
spool file it is copied once, by ``writev`` straight from the pieces the encoder made,
and the main process maps the file and hashes and writes shards from the mapping. The file
is unlinked as soon as it is mapped (the mapping lives until its last slice is released),
so a finished unit leaves nothing behind; a killed import's leftovers sit under the
journal folder and go with it (:func:`clear_spool` at the start of the next run).
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

Buffer = bytes | memoryview

_IOV_MAX = 1024  # pieces per writev (Linux's IOV_MAX)
SPOOL_DIR = ".shardstream-build/spool"  # under the build's local staging folder


def spool_folder(staging: Path) -> Path:
    """The spool folder of a build whose shards are written into ``staging`` (emptied)."""
    folder = staging / SPOOL_DIR
    clear_spool(folder)
    folder.mkdir(parents=True)
    return folder


def clear_spool(folder: Path) -> None:
    """Remove ``folder`` and whatever a killed run left in it."""
    shutil.rmtree(folder, ignore_errors=True)


class SpoolWriter:
    """A new spool file in ``folder``, written a list of pieces at a time (``writev``
    straight from the pieces: a batch's encoded bytes are never joined in the worker)."""

    def __init__(self, folder: str) -> None:
        self.fd, self.path = tempfile.mkstemp(prefix="unit-", suffix=".bin", dir=folder)

    def write(self, pieces: Sequence[Buffer]) -> None:
        """Append the concatenation of ``pieces``."""
        for i in range(0, len(pieces), _IOV_MAX):
            batch = pieces[i : i + _IOV_MAX]
            written = os.writev(self.fd, batch)
            total = sum(map(len, batch))
            rest = memoryview(b"".join(batch))[written:] if written < total else b""
            while rest:  # a short write (rare on a regular file): finish it
                rest = rest[os.write(self.fd, rest) :]

    def close(self) -> str:
        """Close the file; its path."""
        os.close(self.fd)
        return self.path


def map_spool(path: str) -> memoryview:
    """The bytes of the spool file at ``path``, mapped read-only; the file is unlinked."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    os.unlink(path)
    return memoryview(data)
