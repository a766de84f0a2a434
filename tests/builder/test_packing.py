"""The text kind's cut (``StreamCutter``, its pieces gathered as a local build and a Ray worker
do): exact sequences, only the tail dropped, and resume from any shard end."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.shard_builder.packing import StreamCutter, StreamPosition, gather

chunk_lists = st.lists(st.integers(0, 60), min_size=0, max_size=12)


def _chunks(lengths: list[int]) -> list[np.ndarray]:
    out, start = [], 0
    for n in lengths:
        out.append(np.arange(start, start + n, dtype=np.uint32))
        start += n
    return out


def _run(
    chunks: list[np.ndarray], seq: int, per_shard: int, start: StreamPosition
) -> tuple[list[np.ndarray], list[StreamPosition], int, int]:
    cutter = StreamCutter(seq, per_shard, start)
    blocks, positions = [], []
    arrays = dict(enumerate(chunks))
    for number in range(start.chunk, len(chunks)):
        for cut in cutter.add(number, len(chunks[number])):
            blocks.append(gather(cut.pieces, arrays).reshape(-1, seq))
            positions.append(cut.position)
    last, dropped = cutter.finish()
    if last is not None:
        blocks.append(gather(last.pieces, arrays).reshape(-1, seq))
    return blocks, positions, dropped, cutter.tokens_seen


@settings(max_examples=200, deadline=None)
@given(chunk_lists, st.integers(1, 7), st.integers(1, 5))
def test_blocks_are_the_stream_cut_in_order(lengths: list[int], seq: int, per_shard: int) -> None:
    chunks = _chunks(lengths)
    total = sum(lengths)
    blocks, positions, dropped, seen = _run(chunks, seq, per_shard, StreamPosition(0, 0, 0))
    assert seen == total
    assert dropped == total % seq
    stream = np.concatenate(blocks).reshape(-1) if blocks else np.empty(0, np.uint32)
    np.testing.assert_array_equal(stream, np.arange(total - dropped))
    assert all(b.shape == (per_shard, seq) for b in blocks[: len(positions)])
    # Each position says how many stream tokens precede it: exactly the shards so far.
    assert [p.tokens_before for p in positions] == [
        (i + 1) * seq * per_shard for i in range(len(positions))
    ]


@settings(max_examples=200, deadline=None)
@given(chunk_lists, st.integers(1, 7), st.integers(1, 5), st.data())
def test_resuming_at_any_shard_end_gives_the_same_rest(
    lengths: list[int], seq: int, per_shard: int, data: st.DataObject
) -> None:
    chunks = _chunks(lengths)
    blocks, positions, dropped, _ = _run(chunks, seq, per_shard, StreamPosition(0, 0, 0))
    if not positions:
        return
    k = data.draw(st.integers(0, len(positions) - 1))
    resumed = StreamPosition.from_dict(positions[k].to_dict())
    rest, _, rest_dropped, seen = _run(chunks, seq, per_shard, resumed)
    assert rest_dropped == dropped and seen == sum(lengths)
    assert len(rest) == len(blocks) - (k + 1)
    for a, b in zip(rest, blocks[k + 1 :], strict=True):
        np.testing.assert_array_equal(a, b)
