"""The distribution ships as designed: built as a wheel, installed outside the checkout.

The repository keeps ``client/``, ``server/`` and ``shard_builder/`` at the top level and
reaches them through symlinks in ``shardstream/``; this test proves that layout builds a
wheel whose import names are ``shardstream.*`` only, with a working console script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SESSION_START = time.time()  # this module is imported at collection, before any test runs
SUBPACKAGES = ("shardstream.client", "shardstream.server", "shardstream.shard_builder")


def _source_tree(dest: Path) -> Path:
    """A copy of the checkout's files (tracked and new, not ignored), symlinks kept.

    Building from the checkout itself would reuse its ignored ``build/`` folder, where
    setuptools leaves modules that were since removed, and ship them in the wheel.
    """
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, dest / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = _source_tree(tmp_path_factory.mktemp("source"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(out),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("shardstream-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed, seeing this environment's dependencies.

    The dependencies come through a ``.pth`` line naming this environment's site-packages:
    a plain path entry, so the editable install's own ``.pth`` hooks there are not run and
    ``shardstream`` can only come from the wheel.
    """
    env_dir = tmp_path_factory.mktemp("venv")
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            str(wheel),
        ],
        check=True,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def test_wheel_holds_only_shardstream_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert all(t == "shardstream" or t.endswith(".dist-info") for t in top_level), top_level
    for sub in SUBPACKAGES:
        assert sub.replace(".", "/") + "/__init__.py" in names
    assert "shardstream/py.typed" in names


def _run_outside_checkout(python: Path, code: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(python), "-I", "-c", code], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_wheel_ships_the_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    needed = ["alembic.ini", "env.py", "script.py.mako", "versions/0001_initial_schema.py"]
    for name in [*needed, "versions/0002_version_idempotency_key.py"]:
        assert f"shardstream/server/migrations/{name}" in names, name


def test_the_suite_writes_no_build_folder_into_the_checkout() -> None:
    """setuptools builds in ``build/`` beside ``pyproject.toml``: a test that builds the
    checkout itself (``pip wheel <repo>``) leaves one there. ``.gitignore`` hides it from
    ``git status``, so this looks: nothing under it may be newer than this session."""
    written = [
        path for path in (REPO / "build").rglob("*") if path.lstat().st_mtime >= _SESSION_START
    ]
    assert not written, f"a test built in the checkout (build from _source_tree): {written[:3]}"


def test_installed_wheel_imports_every_package(installed: Path, tmp_path: Path) -> None:
    python = installed / "bin" / "python"
    code = (
        "import importlib, pkgutil, shardstream\n"
        "names = ['shardstream'] + [m.name for m in pkgutil.walk_packages("
        "shardstream.__path__, 'shardstream.') if m.ispkg]\n"
        "for n in names:\n"
        "    mod = importlib.import_module(n)\n"
        "    print(n, mod.__file__)\n"
    )
    out = _run_outside_checkout(python, code, tmp_path)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    for sub in ("shardstream", *SUBPACKAGES):
        assert sub in lines, out
        # imported from the installed wheel, never from the source checkout
        assert str(REPO) not in lines[sub], lines[sub]


def test_console_script_runs(installed: Path, tmp_path: Path) -> None:
    script = installed / "bin" / "shardstream"
    assert script.exists()
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "shardstream" in result.stdout
    version = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert version.stdout.strip() == "shardstream 0.1.0"
