"""The read jobs of one partial shard (reads/requests.py), without I/O."""

from __future__ import annotations

import numpy as np

from shardstream.client.reads.blocks import BlockState, BlockTable
from shardstream.client.reads.link import LinkEstimate
from shardstream.client.reads.queue import DEMAND, FILL
from shardstream.client.reads.requests import BlockRequests, ReadJob


def _requests(blocks: int, *, range_blocks: int = 2, bulk: bool = False) -> BlockRequests:
    return BlockRequests(
        BlockTable(blocks), block_size=1, range_blocks=range_blocks, link=LinkEstimate(), bulk=bulk
    )


def ids(*blocks: int) -> np.ndarray:
    return np.array(blocks, dtype=np.int64)


def test_a_request_starts_the_missing_blocks_in_runs_of_range_bytes() -> None:
    reqs = _requests(8)
    jobs = reqs.plan(ids(0, 1, 2, 5))
    assert [(j.first, j.last) for j in jobs] == [(0, 1), (2, 2), (5, 5)]
    assert all(j.priority == DEMAND for j in jobs)
    assert reqs.plan(ids(0, 1, 2, 5)) == []  # in flight: not read twice
    table = reqs._blocks
    assert table.state(5) is BlockState.IN_FLIGHT and table.state(3) is BlockState.MISSING


def test_a_batch_takes_over_a_queued_fill_read_whole() -> None:
    reqs = _requests(8, range_blocks=4)
    (fill,) = reqs.plan(ids(0, 1, 2, 3), FILL)
    (batch,) = reqs.plan(ids(2), DEMAND)
    assert (batch.first, batch.last, batch.priority) == (0, 3, DEMAND)  # the whole range
    assert reqs.start(fill) == []  # the batch's read fetches them
    assert reqs.start(batch) == [(0, 3)]


def test_a_started_fill_read_is_not_taken_over() -> None:
    reqs = _requests(8, range_blocks=4)
    (fill,) = reqs.plan(ids(0, 1, 2, 3), FILL)
    assert reqs.start(fill) == [(0, 3)]
    assert reqs.plan(ids(2), DEMAND) == []  # it is on the way already


def test_a_bulk_shard_lengthens_a_request_over_the_free_blocks_after_it() -> None:
    reqs = _requests(64, range_blocks=2, bulk=True)
    assert reqs.bulk_blocks() > 64  # 1-byte blocks: the link's bulk is longer than the shard
    assert len(reqs.plan(ids(40))) == 1
    (job,) = reqs.plan(ids(0), bulk=True)
    assert (job.first, job.last) == (0, 39)  # up to the block already on the way
    assert reqs.start(job) == [(0, 39)]
    assert reqs._blocks.in_flight(slice(0, 41)).all()
    plain = _requests(64, range_blocks=2, bulk=False)
    assert plain.plan(ids(0), bulk=True) == [ReadJob(0, 0, 1, DEMAND)]  # not a fill: short
