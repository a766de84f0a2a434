"""Folders and files private to this user: the one rule for node-local state.

The shard cache and the memory-peer folder live in places other local users can often
reach (the default cache is under ``/tmp``). A folder another user created, or can write,
lets that user swap a cached shard and forge its verified marker, or plant links and
stall claims; files readable by everyone leak the data. So every such folder must be a
real folder (not a link) owned by this user and not writable by group or others
(:func:`folder_problem`); what we create ourselves is mode 0700 (folders) and 0600 (files)
whatever the umask.

>>> problem = private_folder(Path("/tmp/shardstream-cache-0"))
>>> if problem:
...     raise ConfigError(f"cannot use {problem}")
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "folder_problem",
    "open_private",
    "private_folder",
    "write_private",
]

DIR_MODE = 0o700
"""Folders we create: this user only."""
FILE_MODE = 0o600
"""Files we create: this user only."""


def folder_problem(folder: Path, st: os.stat_result) -> str:
    """Why ``folder`` (whose ``lstat`` is ``st``) cannot be trusted, with the fix; ``""``
    when it can: a real folder, owned by this user, not writable by group or others."""
    uid = os.getuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder (a link or a file); remove it or choose another folder"
    if st.st_uid != uid:
        return (
            f"{folder} belongs to another user (uid {st.st_uid}, you are uid {uid}), who "
            "could replace what is in it; remove it or choose a folder of your own"
        )
    if st.st_mode & 0o022:
        return (
            f"{folder} can be written by other users (mode {stat.S_IMODE(st.st_mode):04o}), "
            f"who could replace what is in it; run `chmod go-w {folder}` or choose another "
            "folder"
        )
    return ""


def private_folder(folder: Path, *, tighten: bool = True) -> str:
    """Create ``folder`` (mode 0700, its missing parents as the umask says) if missing and
    check it with :func:`folder_problem`; returns the problem, ``""`` when usable.

    ``tighten``: a folder of ours that others may read or enter is made 0700 (our own
    internal folders); without it only a folder created here is (a folder the user chose
    keeps its mode). Raises OSError when the folder cannot be created or examined."""
    created = False
    try:
        folder.mkdir(mode=DIR_MODE)
        created = True
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=DIR_MODE)
            created = True
    except FileExistsError:
        pass
    st = os.lstat(folder)
    problem = folder_problem(folder, st)
    if not problem and (created or tighten) and stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(folder, DIR_MODE)  # mkdir's mode went through the umask
    return problem


def open_private(path: Path | str, flags: int) -> int:
    """``os.open`` that creates a missing file with mode 0600 whatever the umask, and
    never follows a link."""
    fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != FILE_MODE and st.st_uid == os.getuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (a private temporary file, then a rename):
    readers see all or nothing, and the file is 0600."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(data)}.tmp")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
