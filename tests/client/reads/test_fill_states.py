"""The state of a process's cache fills: one owner, named transitions, stages that only move up.

The leases schedule fills, the fills run them and the demand reads where they stand; the
state they share lives in :class:`FillStates` behind its own lock. The first tests walk
each transition on the state alone; the last one records every stage a real read path's
fills pass through (ranged reads of S3 shards into the node cache) and checks that each
attempt only moved up and ended once its file was leased.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from shardstream.client import CacheOptions, ReadOptions, Source
from shardstream.client.reads import ReadPass, ShardReads
from shardstream.client.reads.fill_states import FillAttempt, FillStage, FillStates
from shardstream.client.reads.partial import PartialShard
from shardstream.client.sources.source import resolve_source
from shardstream.mds import ShardReader
from tests.fixtures.ranged_shards import N, tokens_of, upload_folder, write_ranged_shards
from tests.fixtures.s3 import S3Bucket

# Stand-ins for the objects the state only holds and hands back (it never calls them).
PARTIAL = cast(PartialShard, object())
READER = cast(ShardReader, object())


def test_a_scheduled_fill_runs_completes_and_ends_when_leased() -> None:
    states = FillStates()
    attempt = states.schedule(3)
    assert states.stage(3) is FillStage.SCHEDULED
    assert states.starting(3) is attempt.started  # readers may wait for it
    assert states.filling(3) is None and states.serving(3) is None

    states.run(3, PARTIAL, attempt)
    assert attempt.started.is_set() and states.starting(3) is None
    assert states.filling(3) is PARTIAL and states.serving(3) is PARTIAL
    assert states.running() == [PARTIAL]

    states.complete(attempt, READER)
    assert states.stage(3) is FillStage.COMPLETE
    assert states.serving(3) is READER  # the reader first, while the partial still runs
    assert states.filling(3) is PARTIAL

    states.end(attempt)  # the fill's thread is done with the file
    assert states.stage(3) is FillStage.COMPLETE and states.completed(3) is READER
    assert states.filling(3) is None and states.running() == []

    states.leased(3)
    assert states.stage(3) is FillStage.ENDED
    assert states.completed(3) is None and states.serving(3) is None


def test_a_failed_fill_ends_and_serves_nothing() -> None:
    states = FillStates()
    attempt = states.schedule(0)
    states.run(0, PARTIAL, attempt)
    states.end(attempt)  # no complete(): it failed
    assert states.stage(0) is FillStage.ENDED
    assert states.serving(0) is None and states.starting(0) is None
    states.give_up(attempt)  # the queued job returns: nothing changes
    assert states.stage(0) is FillStage.ENDED


def test_a_scheduled_fill_that_never_ran_ends_and_wakes_its_waiters() -> None:
    states = FillStates()
    attempt = states.schedule(1)
    waiter = threading.Thread(target=attempt.started.wait)
    waiter.start()
    states.give_up(attempt)  # the shard was cached meanwhile, or its download failed
    waiter.join()
    assert states.stage(1) is FillStage.ENDED and states.starting(1) is None


def test_a_completed_fill_leased_before_its_thread_ends_ends_then() -> None:
    states = FillStates()
    attempt = states.schedule(2)
    states.run(2, PARTIAL, attempt)
    states.complete(attempt, READER)
    states.leased(2)
    assert states.completed(2) is None and states.stage(2) is FillStage.COMPLETE
    states.end(attempt)
    assert states.stage(2) is FillStage.ENDED


def test_a_lease_s_own_fill_is_a_new_attempt_and_close_drops_readers() -> None:
    states = FillStates()
    old = states.schedule(5)
    states.give_up(old)
    attempt = states.run(5, PARTIAL, None)  # a lease fills it itself
    assert attempt is not old and attempt.started.is_set()
    assert old.stage is FillStage.ENDED and states.stage(5) is FillStage.RUNNING
    states.complete(attempt, READER)
    states.end(attempt)
    states.close()
    assert states.completed(5) is None and states.stage(5) is FillStage.ENDED


@pytest.mark.parametrize(
    "move",
    [
        lambda s, a: s.run(a.shard, PARTIAL, a),  # a completed fill cannot run again
        lambda s, a: s.complete(a, READER),  # nor complete twice after it ended
    ],
)
def test_a_stage_never_moves_down(move: Any) -> None:
    states = FillStates()
    attempt = states.schedule(7)
    states.run(7, PARTIAL, attempt)
    states.complete(attempt, READER)
    states.end(attempt)
    states.leased(7)
    with pytest.raises(RuntimeError, match=r"shard 7: a fill cannot go from ENDED back"):
        move(states, attempt)
    assert attempt.stage is FillStage.ENDED


class _Recording(FillStates):
    """The read path's fill state, recording each attempt's stage after every transition."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, list[list[FillStage]]] = {}
        self._ids: dict[int, int] = {}
        self._record_lock = threading.Lock()

    def _record(self, attempt: FillAttempt) -> None:
        with self._record_lock:
            runs = self.seen.setdefault(attempt.shard, [])
            if id(attempt) not in self._ids:
                self._ids[id(attempt)] = len(runs)
                runs.append([])
            runs[self._ids[id(attempt)]].append(attempt.stage)

    def schedule(self, shard: int) -> FillAttempt:
        attempt = super().schedule(shard)
        self._record(attempt)
        return attempt

    def run(self, shard: int, partial: PartialShard, scheduled: FillAttempt | None) -> FillAttempt:
        attempt = super().run(shard, partial, scheduled)
        self._record(attempt)
        return attempt

    def complete(self, attempt: FillAttempt, reader: ShardReader) -> None:
        super().complete(attempt, reader)
        self._record(attempt)

    def end(self, attempt: FillAttempt) -> None:
        super().end(attempt)
        self._record(attempt)

    def give_up(self, attempt: FillAttempt) -> None:
        super().give_up(attempt)
        self._record(attempt)


def test_a_read_path_s_fills_only_move_up(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    """Every sample of a ranged S3 dataset read through the node cache, chunk by chunk:
    every shard is filled by one attempt that goes SCHEDULED, RUNNING, COMPLETE and ends
    once its published file is leased; the samples are right."""
    write_ranged_shards(tmp_path / "ds")
    upload_folder(tmp_path / "ds", f"{s3_bucket.url}/fills")
    source = resolve_source(Source(f"{s3_bucket.url}/fills/index.json"))
    count = len(source.shards)
    reads = ShardReads(
        [source], CacheOptions(dir=tmp_path / "cache"), ReadOptions(piece_read_batches=0)
    )
    recording = reads.shared.fill_states = _Recording()
    order = np.arange(count, dtype=np.int64)
    reads.start_pass(ReadPass(order, order, [1.0] * count, lambda: (0, {})))
    sizes = [s.samples for s in source.shards]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    chunk = 64
    ids: list[int] = []
    try:
        for first in range(0, N, chunk):
            sample = np.arange(first, min(first + chunk, N))
            shards = np.searchsorted(starts, sample, side="right") - 1
            local = sample - starts[shards]
            reads.want(shards, local)
            with reads.need(shards, local) as reader:
                for shard, i in zip(shards.tolist(), local.tolist(), strict=True):
                    row = reader(shard)[i]
                    assert np.array_equal(row["tokens"], tokens_of(row["id"]))
                    ids.append(int(row["id"]))
        for shard in range(count):  # every fill landed: lease each published file
            reads.leases.reader(shard)
    finally:
        reads.close(finish_fills_s=60)
    assert ids == list(range(N))
    assert reads.stats.bytes_fetched > 0
    filled = {shard for shard, runs in recording.seen.items() if FillStage.RUNNING in runs[0]}
    assert filled, "no shard was filled through the cache"
    for shard, runs in recording.seen.items():
        for stages in runs:
            assert stages == sorted(stages), (shard, stages)  # only up
            assert stages[-1] in (FillStage.COMPLETE, FillStage.ENDED), (shard, stages)
    for shard in filled:
        assert recording.stage(shard) is FillStage.ENDED  # leased, then closed
