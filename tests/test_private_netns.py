"""The tests that start Ray or torch.distributed run in a private network namespace, and the
fixtures refuse to start either anywhere else.

At every head start Ray's dashboard probes a cloud metadata address (169.254.169.254), and
torch's TCPStore asks DNS for the name of each loopback peer it accepts (``::ffff:127.0.0.1``
has no hosts entry, so glibc sends a PTR query to the resolver); from the host's namespace
both leave the machine. ``tests/conftest.py`` takes the tests marked ``ray`` or
``distributed`` out of a host-namespace session and the runner below runs them again under
``tools/in-private-netns``, where loopback is the only interface.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PRIVATE_TESTS
from tests.fixtures.netns import (
    PRIVATE_MARKS,
    REPO,
    STARTS_DISTRIBUTED,
    STARTS_RAY,
    WRAPPER,
    wrapped,
)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_marked_tests_run_in_a_private_network_namespace(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    nodeids = request.config.stash.get(PRIVATE_TESTS, []) or ["tests"]
    log = tmp_path / "private-netns-tests.log"
    with log.open("wb") as out:
        run = subprocess.run(
            wrapped(
                [
                    *(sys.executable, "-m", "pytest", "-m", " or ".join(PRIVATE_MARKS)),
                    *("-p", "no:cacheprovider"),
                    # Its own basetemp: a second session would otherwise prune this one's.
                    *("--basetemp", str(tmp_path / "inner"), *nodeids),
                ]
            ),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    output = log.read_text(errors="replace")
    print(output[-4000:])
    assert run.returncode == 0, f"the namespace's tests failed there:\n{_failures(output)}"
    assert re.search(r"\b\d+ passed\b", output), output[-2000:]


def _failures(output: str) -> str:
    """The failed tests' tracebacks without their captured output (Ray's, torch's and moto's logs
    would bury them: the tail of the run showed logs only), then the run's summary."""
    if "= FAILURES =" not in output:
        return output[-12000:]
    body = output.split("= FAILURES =", 1)[1]
    traces = re.sub(r"\n-{5,} Captured .*?(?=\n_{5,} |\n={5,} )", "", body, flags=re.S)
    return traces[:12000] + "\n...\n" + output[-1500:]


def _guard_in_netns(setup: str) -> subprocess.CompletedProcess[str]:
    """Run the fixtures' guard in a fresh private namespace after ``setup`` (shell)."""
    code = "from tests.fixtures.netns import require_private_netns; require_private_netns()"
    return subprocess.run(
        [str(WRAPPER), "bash", "-c", f'{setup} && "$0" -c "$1"', sys.executable, code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_guard_refuses_where_another_interface_is_visible() -> None:
    # Loopback alone: allowed. One more interface (a tun device, still offline): refused.
    assert _guard_in_netns("true").returncode == 0
    refused = _guard_in_netns("ip tuntap add dev shardstream0 mode tun")
    assert refused.returncode != 0
    assert "refusing to start Ray" in refused.stderr and "shardstream0" in refused.stderr
    assert "tools/in-private-netns" in refused.stderr


def test_the_wrapper_has_only_loopback_and_its_own_home() -> None:
    script = (
        "import os, socket; print(sorted(n for _, n in socket.if_nameindex())); "
        "print(os.environ['HOME'])"
    )
    run = subprocess.run(
        [str(WRAPPER), sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    )
    names, home = run.stdout.splitlines()
    assert names == "['lo']"
    assert home != str(Path.home()) and "shardstream-netns-home" in home
    assert not Path(home).exists()  # removed at the end


def _starts(pattern: re.Pattern[str], path: Path) -> bool:
    code = (line for line in path.read_text(errors="replace").splitlines())
    return any(pattern.search(line) for line in code if not line.lstrip().startswith("#"))


def _unmarked(pattern: re.Pattern[str], mark: str, allowed: set[Path]) -> list[Path]:
    return [
        path.relative_to(REPO)
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.relative_to(REPO) not in allowed
        and _starts(pattern, path)
        and f"pytest.mark.{mark}" not in path.read_text()
    ]


def test_every_test_that_starts_ray_is_marked() -> None:
    """A test module that starts Ray carries the ``ray`` mark (so it runs in the namespace)."""
    allowed = {
        Path("tests/fixtures/ray_cluster.py"),  # the fixture refuses outside the namespace
        Path("tests/fixtures/netns.py"),
        Path("tests/test_private_netns.py"),
        # ``--ray`` is refused for imports before anything of Ray starts (asserted there).
        Path("tests/builder/test_import_cli.py"),
        # ``--ray`` with ``--skip-bad`` is refused before Ray starts (asserted there).
        Path("tests/builder/test_skip_bad_lines.py"),
    }
    unmarked = _unmarked(STARTS_RAY, "ray", allowed)
    assert unmarked == [], f"start Ray without the ray mark: {unmarked}"


def test_every_test_that_starts_torch_distributed_is_marked() -> None:
    """A test module that starts a gloo job (torchrun, a process group, the harness's rank
    jobs, the demo) carries the ``distributed`` mark, so it runs in the namespace."""
    allowed = {
        Path("tests/fixtures/netns.py"),
        Path("tests/test_private_netns.py"),
        # The harness itself: its Job refuses to start outside the namespace.
        *(p.relative_to(REPO) for p in (REPO / "tests" / "harness").glob("*.py")),
        # The integrations' rank scripts, run only by their (marked) tests.
        Path("tests/client/integrations/accelerate_job.py"),
        Path("tests/client/integrations/hf_job.py"),
        Path("tests/client/integrations/launch.py"),
        # Names torchrun in a docstring (a launcher's ids); starts no process group.
        Path("tests/server/test_ledger.py"),
    }
    unmarked = _unmarked(STARTS_DISTRIBUTED, "distributed", allowed)
    assert unmarked == [], f"start torch.distributed without the distributed mark: {unmarked}"


_GLOO_JOB = """
import sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
url = f"tcp://127.0.0.1:{sys.argv[2]}"
dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2)
t = torch.ones(1); dist.all_reduce(t); assert t.item() == 2.0
dist.destroy_process_group()
"""

_CONNECT = re.compile(r"connect\(\d+, \{sa_family=AF_INET6?, (?P<addr>[^}]*)\}, \d+\) = (?P<rc>.*)")
_IP = re.compile(r'inet_(?:addr|pton)\((?:AF_INET6, )?"([^"]+)"')


def _dialed(trace: str) -> list[tuple[str, str]]:
    """(address, result) of every IP connect() in an ``strace -f -e connect`` log."""
    out = []
    for m in _CONNECT.finditer(trace):
        if addr := _IP.search(m["addr"]):
            out.append((addr.group(1), m["rc"].strip()))
    return out


def _loopback(addr: str) -> bool:
    return addr.startswith(("127.", "::ffff:127.")) or addr == "::1"


def _went_out(result: str) -> bool:
    """A connect() that reached the network: done, or a TCP handshake under way."""
    return result == "0" or "EINPROGRESS" in result


@pytest.mark.slow
def test_a_gloo_job_in_the_namespace_dials_only_loopback(tmp_path: Path) -> None:
    """Two gloo ranks under strace, in the wrapper: every connect() that went through was to
    loopback. The TCPStore's name lookups still try the resolver there, and fail at once
    (no route), so nothing leaves the machine; the same job in the host's namespace is what
    sent about ten PTR queries per launch."""
    script = tmp_path / "gloo_job.py"
    script.write_text(_GLOO_JOB)
    shell = (
        'port=$("$0" -c "import socket; s=socket.socket(); s.bind((\'127.0.0.1\', 0)); '
        'print(s.getsockname()[1])"); '
        'strace -f -qq -e trace=connect -o "$2.0" "$0" "$1" 0 "$port" & '
        'strace -f -qq -e trace=connect -o "$2.1" "$0" "$1" 1 "$port"; wait $!'
    )
    run = subprocess.run(
        wrapped(["bash", "-c", shell, sys.executable, str(script), str(tmp_path / "trace")]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    dialed = _dialed((tmp_path / "trace.0").read_text() + (tmp_path / "trace.1").read_text())
    assert any(_loopback(addr) for addr, _ in dialed), dialed  # the ranks did meet
    outside = [(addr, rc) for addr, rc in dialed if not _loopback(addr) and _went_out(rc)]
    assert outside == [], f"connected outside loopback: {outside}"
