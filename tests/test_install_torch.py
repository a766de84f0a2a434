"""``make demo`` installs the PyTorch this machine can use (``tools/install-torch``): without
an NVIDIA GPU its CPU build, from PyTorch's CPU index where that can be reached, saying what
it installs and why it takes long. pip is a stand-in that records its arguments, and the
"CPU index" a server on loopback: nothing here downloads anything."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "install-torch"
BASH = shutil.which("bash") or "/bin/bash"


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A stand-in for PyTorch's CPU index on loopback (it answers ``<index>/torch/``)."""
    root = tmp_path / "index"
    (root / "whl" / "cpu" / "torch").mkdir(parents=True)
    (root / "whl" / "cpu" / "torch" / "index.html").write_text("<html></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when this returns


def _install(
    tmp: Path,
    *,
    index: str,
    gpu_tool: bool = False,
    device: bool = False,
    listed: str = "2.14.1, 2.13.0",
    requirements: tuple[str, ...] = ("torch==2.14.1",),
    torch_installed: str | None = None,
) -> tuple[str, list[str]]:
    """Run the script with a recording pip whose index lists ``listed`` torch versions,
    beside a python that has torch ``torch_installed`` (or none); returns (the script's
    output, the arguments of ``pip install``)."""
    venv = tmp / "venv" / "bin"
    venv.mkdir(parents=True)
    record = tmp / "pip-args"
    pip = venv / "pip"
    pip.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "if sys.argv[1:3] == ['index', 'versions']:\n"
        f"    print('torch (2.14.1)\\nAvailable versions: {listed}')\n"
        "else:\n"
        f"    open({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n"
    )
    pip.chmod(0o755)
    # The venv's python (the index probe, the installed torch's version): this one without
    # its site-packages, so that only the torch this test puts there is installed.
    site = tmp / "site"
    site.mkdir()
    if torch_installed is not None:
        info = site / f"torch-{torch_installed}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_installed}\n"
        )
    (venv / "python").write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    (venv / "python").chmod(0o755)
    tools = tmp / "path"  # PATH: what the script needs, and nvidia-smi only when asked
    tools.mkdir()
    for tool in ("dirname", "sed", "tr", "grep"):
        (tools / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    if gpu_tool:
        (tools / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (tools / "nvidia-smi").chmod(0o755)
    devices = tmp / "dev"
    devices.mkdir()
    if device:
        (devices / "nvidia0").touch()
    env = {
        "PATH": str(tools),
        "TORCH_CPU_INDEX": index,
        "SHARDSTREAM_NVIDIA_DEVICES": f"{devices}/nvidia*",
    }
    done = subprocess.run(
        [BASH, str(SCRIPT), str(pip), *requirements],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, record.read_text().splitlines()


def test_without_a_gpu_the_cpu_build_is_installed(tmp_path: Path, cpu_index: str) -> None:
    out, args = _install(tmp_path, index=cpu_index, requirements=("--quiet", "torch==2.14.1"))
    assert args == ["install", "--extra-index-url", cpu_index, "--quiet", "torch==2.14.1"]
    assert "no NVIDIA GPU here" in out and "CPU build" in out and "a minute or two" in out


def test_an_unreachable_cpu_index_falls_back_to_the_usual_one(tmp_path: Path) -> None:
    unreachable = f"http://127.0.0.1:{_closed_port()}/whl/cpu"
    out, args = _install(tmp_path / "pinned", index=unreachable)
    assert args == ["install", "torch==2.14.1"]  # a pinned version stays as asked
    assert "cannot be reached" in out and "several minutes" in out
    # Unpinned: the newest CPU build the usual index lists (a mirror may hold one) ...
    out, args = _install(
        tmp_path / "cpu",
        index=unreachable,
        listed="2.14.1, 2.13.0+cpu, 2.12.0+cpu",
        requirements=("--quiet",),
    )
    assert args == ["install", "--quiet", "torch==2.13.0+cpu"]
    assert "installing torch 2.13.0+cpu, the newest CPU build the usual index has" in out
    # ... and where it lists none, the usual torch.
    out, args = _install(tmp_path / "none", index=unreachable, requirements=("torch",))
    assert args == ["install", "torch"]


@pytest.mark.parametrize(("gpu_tool", "device"), [(True, False), (False, True)])
def test_with_a_gpu_the_cuda_build_is_installed(
    tmp_path: Path, cpu_index: str, gpu_tool: bool, device: bool
) -> None:
    out, args = _install(tmp_path, index=cpu_index, gpu_tool=gpu_tool, device=device)
    assert args == ["install", "torch==2.14.1"]
    assert "an NVIDIA GPU is here" in out and "5 GB" in out


def test_the_makefile_installs_torch_first_and_says_so() -> None:
    done = subprocess.run(
        ["make", "-n", "demo", "install-dev"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    lines = done.stdout.splitlines()
    torch_step = next(i for i, line in enumerate(lines) if "tools/install-torch" in line)
    package_step = next(i for i, line in enumerate(lines) if "-e '.[server,builder]'" in line)
    assert torch_step < package_step
    assert any(
        "tools/install-torch .venv/bin/pip --quiet 'torch==2.14.1' 'torchvision==0.29.1'" in line
        for line in lines
    ), done.stdout


@pytest.mark.parametrize("installed", ["2.14.1+cpu", None])
def test_torchvision_comes_for_the_torch_installed(
    tmp_path: Path, cpu_index: str, installed: str | None
) -> None:
    """``make vision``: torchvision alone asked for is the build for the torch that is here
    (pinned beside it, so pip neither swaps torch for a CUDA build nor installs a
    torchvision that cannot import); with no torch, both come as a matched pair."""
    out, args = _install(
        tmp_path,
        index=cpu_index,
        requirements=("--quiet", "torchvision"),
        torch_installed=installed,
    )
    torch = f"torch=={installed}" if installed else "torch"
    assert args == ["install", "--extra-index-url", cpu_index, "--quiet", torch, "torchvision"]
    if installed:
        assert f"torch {installed} is installed here: keeping it" in out
    # A torch the caller pins stays as asked.
    _, args = _install(
        tmp_path / "pinned",
        index=cpu_index,
        requirements=("torch==2.13.0", "torchvision==0.28.0"),
        torch_installed=installed,
    )
    assert args[-2:] == ["torch==2.13.0", "torchvision==0.28.0"]


def test_make_vision_installs_a_matched_torchvision_then_the_extra_from_the_checkout() -> None:
    done = subprocess.run(
        ["make", "-n", "vision"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    lines = done.stdout.splitlines()
    matched = next(
        i for i, line in enumerate(lines) if "install-torch" in line and "torchvision" in line
    )
    extra = next(i for i, line in enumerate(lines) if "pip install" in line and "vision]'" in line)
    assert matched < extra
    assert "-e '.[server,builder,vision]'" in lines[extra]
