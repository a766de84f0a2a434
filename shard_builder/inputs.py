"""Finding the input files of a build and recording their lineage.

Inputs are files, directories (searched recursively) or glob patterns. Each argument's
matches are sorted by path and arguments keep the order given, so the same command always
reads the same files in the same order: the first step of a deterministic build.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstream.errors import InputError

_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class InputFile:
    """One input file: its path, size and modification time (for lineage and resume)."""

    path: Path
    size: int
    mtime_ns: int

    def lineage(self) -> dict[str, Any]:
        """JSON form recorded in the build result and the dataset metadata."""
        return {"path": str(self.path), "size": self.size, "mtime_ns": self.mtime_ns}


def stat_file(path: Path) -> InputFile:
    """Size and mtime of ``path``; :class:`InputError` if it cannot be read."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InputError(f"{path}: cannot read input file ({exc.strerror})") from exc
    # abspath, not resolve(): resolve stats every path component, which dominates the
    # planning of a folder of a million images.
    return InputFile(path=Path(os.path.abspath(path)), size=st.st_size, mtime_ns=st.st_mtime_ns)


def inside(folder: str | Path, name: str | Path, what: str = "file") -> Path:
    """``folder / name``, where it resolves (``..``, an absolute name, symlinks) inside
    ``folder``; else one :class:`InputError` naming both.

    A dataset folder from elsewhere must not make an import read, and then publish, some
    other file of the user's: a name its metadata gives, or a symlink it holds, that leads
    out of the folder is refused.
    """
    path = Path(folder, name)
    try:
        root, real = os.path.realpath(folder), os.path.realpath(path)
    except (ValueError, UnicodeError):  # a NUL byte, a lone surrogate: no file's name
        raise InputError(f"{folder}: {str(name)!a} ({what}) is not a valid file name") from None
    if os.path.commonpath([root, real]) != root:
        raise InputError(
            f"{path}: this {what} resolves to {real}, outside the source folder {folder}; "
            "refused (copy the file into the folder, or name it as a source of its own)"
        )
    return path


def plain_names(names: Sequence[str]) -> bool:
    """Whether every one of ``names`` is a plain file name (no separator, not ``.`` or
    ``..``, not empty, no NUL, encodable as a file name): checked in a few calls over all
    of them, not one per name."""
    joined = "\0".join(names)
    try:
        os.fsencode(joined)  # a lone surrogate: no file's name
    except UnicodeError:
        return False
    return (
        os.sep not in joined
        and "/" not in joined
        and joined.count("\0") == len(names) - 1
        and not {"", ".", ".."}.intersection(names)
    )


def names_inside(folder: str | Path, names: Sequence[str], what: str = "file") -> None:
    """Every one of ``names`` checked as :func:`inside` checks one, in time for millions.

    Resolving each name stats every component of its path (a LitData index of a million
    chunks spent 65 s there). But a plain name (:func:`plain_names`) can lead out of the
    folder only as a symlink, and one listing of the folder says which of its entries are
    symlinks: where every name is plain, only those are resolved; else every name is, and
    :func:`inside` names the first bad one.
    """
    plain = plain_names(names)
    links: set[str] = set()
    if plain:
        try:
            with os.scandir(folder) as entries:
                links = {e.name for e in entries if e.is_symlink()}
        except OSError:  # a folder that cannot be listed: resolve every name
            plain = False
        if plain and not links:
            return
    for name in names:  # in order: the first bad one is named
        if not plain or name in links:
            inside(folder, name, what)


def _matches(arg: str, suffixes: tuple[str, ...], confined: bool) -> list[Path]:
    if any(ch in arg for ch in _GLOB_CHARS):
        found = [Path(p) for p in glob.glob(arg, recursive=True)]
        files = [p for p in found if p.is_file()]
        for folder in (p for p in found if p.is_dir()):
            files.extend(_under(folder, suffixes, confined))
        return sorted(set(files))
    path = Path(arg)
    if path.is_dir():
        return _under(path, suffixes, confined)
    if path.is_file():
        return [path]
    raise InputError(f"{arg}: no such file or directory (inputs are files, directories or globs)")


def _under(folder: Path, suffixes: tuple[str, ...], confined: bool) -> list[Path]:
    files = files_under(folder, suffixes)
    if confined:
        for path in files:
            inside(folder, path.relative_to(folder), "file found in the folder")
    return files


def files_under(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Files below ``folder`` (hidden folders skipped) ending in ``suffixes``, sorted."""
    found: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root, n) for n in names if n.lower().endswith(suffixes))
    return sorted(found)


def resolve_inputs(
    args: Iterable[str], suffixes: tuple[str, ...], *, confined: bool = False
) -> list[InputFile]:
    """Every input file named by ``args``, in a deterministic order, without duplicates.

    Directories contribute the files under them whose names end in one of ``suffixes``;
    with ``confined`` (imports: a dataset folder from elsewhere), a file found in a folder
    that is a symlink leading out of it is refused (:func:`inside`); a file named on its own
    is read wherever it is. Raises :class:`InputError` for a path that does not exist or
    when nothing matches.
    """
    seen: set[Path] = set()
    out: list[InputFile] = []
    names = list(args)
    for arg in names:
        for path in _matches(arg, suffixes, confined):
            info = stat_file(path)
            if info.path not in seen:
                seen.add(info.path)
                out.append(info)
    if not out:
        raise InputError(
            f"no input files found in {', '.join(names)} "
            f"(looked for files ending in {', '.join(suffixes)})"
        )
    return out


def lineage(files: Sequence[InputFile]) -> list[dict[str, Any]]:
    """The lineage of a build: each input file with its size and mtime."""
    return [f.lineage() for f in files]


def file_kind(path: Path) -> str:
    """``"parquet"`` or ``"jsonl"`` from a text input file's name."""
    return "parquet" if path.name.lower().endswith((".parquet", ".pq")) else "jsonl"
