"""The Ray tests run in a private network namespace, and Ray refuses to start anywhere else.

At every head start Ray's dashboard probes a cloud metadata address (169.254.169.254); from
the host's namespace that request leaves the machine. ``tests/conftest.py`` takes the tests
marked ``ray`` out of a host-namespace session and the runner below runs them again under
``tools/in-private-netns``, where loopback is the only interface.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RAY_TESTS
from tests.fixtures.netns import REPO, STARTS_RAY, WRAPPER, wrapped


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_ray_tests_run_in_a_private_network_namespace(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    nodeids = request.config.stash.get(RAY_TESTS, []) or ["tests"]
    log = tmp_path / "ray-tests.log"
    with log.open("wb") as out:
        run = subprocess.run(
            wrapped(
                [
                    *(sys.executable, "-m", "pytest", "-m", "ray", "-p", "no:cacheprovider"),
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
    assert run.returncode == 0, f"the Ray tests failed in their namespace:\n{_failures(output)}"
    assert re.search(r"\b\d+ passed\b", output), output[-2000:]


def _failures(output: str) -> str:
    """The failed tests' tracebacks without their captured output (Ray's and moto's logs
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


def _starts_ray(path: Path) -> bool:
    code = (line for line in path.read_text(errors="replace").splitlines())
    return any(STARTS_RAY.search(line) for line in code if not line.lstrip().startswith("#"))


def test_every_test_that_starts_ray_is_marked() -> None:
    """A test module that starts Ray carries the ``ray`` mark (so it runs in the namespace)."""
    allowed = {
        Path("tests/fixtures/ray_cluster.py"),  # the fixture refuses outside the namespace
        Path("tests/fixtures/netns.py"),
        Path("tests/test_ray_netns.py"),
        # ``--ray`` is refused for imports before anything of Ray starts (asserted there).
        Path("tests/builder/test_import_cli.py"),
    }
    unmarked = [
        path.relative_to(REPO)
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.relative_to(REPO) not in allowed
        and _starts_ray(path)
        and "pytestmark = pytest.mark.ray" not in path.read_text()
    ]
    assert unmarked == [], f"start Ray without the ray mark: {unmarked}"
