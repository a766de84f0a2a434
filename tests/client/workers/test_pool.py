"""WorkerPool, the fast loader's pool as a component: driven over a stream, no loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardstream.client import CacheOptions, StreamingDataset
from shardstream.client.workers.pool import WorkerPool
from tests.fixtures.datasets import ids_of, write_tokens

N = 120


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pool") / "ds"
    write_tokens(out, N, size_limit=400)
    return out


def test_a_pool_builds_a_streams_batches_in_plan_order_from_any_start(
    tokens_dir: Path, tmp_path: Path
) -> None:
    ds = StreamingDataset(str(tokens_dir), 4, cache=CacheOptions(dir=tmp_path / "cache"))
    expected = [(b, ids_of(batch)) for b, batch in ds.stream.batches(0, 0)]
    ds.stream.close()
    pool = WorkerPool(ds.stream, 3, 4, copy=True)
    try:
        assert [(b, ids_of(batch)) for b, batch in pool.batches(0, 0)] == expected
        pids = [w.proc.pid for w in pool.workers]
        # A new pass from batch 5 reuses the live workers and starts where it is told.
        assert [(b, ids_of(batch)) for b, batch in pool.batches(0, 5)] == expected[5:]
        assert [w.proc.pid for w in pool.workers] == pids
    finally:
        pool.stop()
    assert pool.workers == []
