"""Fixtures shared by every part's tests.

Each fixture module under ``tests/fixtures`` starts one real component: moto's S3 server
on loopback (``s3``), a PostgreSQL test database (``postgres``), a live shardstream
server under uvicorn (``server``), a two-node Ray cluster on loopback (``ray_cluster``).
``fd_guard`` fails a session that ends holding many more open file descriptors than it
started with, and names the test modules that left them open; ``mosaicml_memory``
releases the shared memory MosaicML's reader would hold until the process exits.
"""

import pytest

from tests.fixtures.netns import PRIVATE_MARKS, in_private_netns

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.server",
    "tests.fixtures.ray_cluster",
    "tests.fixtures.fd_guard",
    "tests.fixtures.mosaicml_memory",
]


# --- Ray and torch.distributed only in a private network namespace (tests/fixtures/netns.py) -

PRIVATE_TESTS = pytest.StashKey[list[str]]()
PRIVATE_RUNNER = "test_marked_tests_run_in_a_private_network_namespace"


def _private(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(mark) is not None for mark in PRIVATE_MARKS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In the host's namespace, hand the tests that start Ray or torch.distributed to the
    runner that starts a private one.

    The tests marked ``ray`` or ``distributed`` are taken out of this session and
    ``tests/test_private_netns.py`` runs exactly them under ``tools/in-private-netns``;
    inside a private namespace the runner itself is the one left out.
    """
    runner = [item for item in items if item.name == PRIVATE_RUNNER]
    if in_private_netns():
        keep, drop = [i for i in items if i not in runner], runner
    else:
        drop = [item for item in items if _private(item)]
        keep = [item for item in items if item not in drop]
        if drop and not runner:
            raise pytest.UsageError(
                f"{len(drop)} selected tests start Ray or torch.distributed, which run only "
                "in a private network namespace; run them with: tools/in-private-netns "
                "python -m pytest -m 'ray or distributed' "
                + " ".join(item.nodeid for item in drop[:3])
                + (" ..." if len(drop) > 3 else "")
            )
        config.stash[PRIVATE_TESTS] = [item.nodeid for item in drop]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
