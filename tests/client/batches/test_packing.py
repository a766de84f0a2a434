"""Read-time packing: the pure algorithm (property-tested) and packed batches that stay a
function of the global order, so a resume on any world size and worker count continues
with exactly the rows an uninterrupted run reads (issue 26)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PackOptions,
    PlanOptions,
    ShardstreamLoader,
    StreamingDataset,
    Topology,
)
from shardstream.client.batches.packing import fill, pack_lengths
from shardstream.errors import ConfigError, ResumeError
from shardstream.mds import MDSWriter

# These rows truncate on purpose (64-token rows, documents of up to 200): the warning is
# tested in test_pack_truncation.py.
pytestmark = pytest.mark.filterwarnings(
    "ignore::shardstream.client.batches.packed.PackingTruncationWarning"
)

lengths_st = st.lists(st.integers(min_value=1, max_value=70), min_size=0, max_size=40)


def _docs(lengths: list[int]) -> list[np.ndarray[Any, Any]]:
    """Document ``d``'s tokens are ``1000 d + i``: every token says where it came from."""
    return [np.arange(n, dtype=np.int64) + 1000 * d for d, n in enumerate(lengths)]


@settings(max_examples=300, deadline=None)
@given(
    lengths=lengths_st,
    seq_len=st.integers(min_value=1, max_value=32),
    rows=st.one_of(st.none(), st.integers(min_value=1, max_value=8)),
    method=st.sampled_from(["greedy", "first_fit"]),
)
def test_every_token_is_placed_once_or_counted_truncated(
    lengths: list[int], seq_len: int, rows: int | None, method: str
) -> None:
    layout = pack_lengths(lengths, seq_len, rows=rows, method=method)
    assert layout.same(pack_lengths(lengths, seq_len, rows=rows, method=method))  # deterministic
    if rows is not None:
        assert layout.rows == rows
    else:
        assert layout.truncated == 0
    assert layout.tokens + layout.truncated == sum(lengths)
    docs = _docs(lengths)
    packed = fill(layout, docs, pad_id=-7)
    ids = packed.input_ids
    assert ids.shape == (layout.rows, seq_len)
    placed = ids[ids != -7]
    assert len(placed) == layout.tokens and len(np.unique(placed)) == len(placed)  # once
    # Each document keeps a prefix of its tokens in order; with rows=None all of them.
    for d, n in enumerate(lengths):
        mine = np.sort(placed[placed // 1000 == d])
        assert mine.tolist() == list(range(1000 * d, 1000 * d + len(mine)))
        assert rows is not None or len(mine) == n
    # Boundaries: positions restart per segment; cu_seqlens cover the rows exactly.
    cu = packed.cu_seqlens
    assert cu[0] == 0 and cu[-1] == layout.rows * seq_len and np.all(np.diff(cu) > 0)
    flat_pos, flat_doc = packed.position_ids.reshape(-1), packed.doc_ids.reshape(-1)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        assert a // seq_len == (b - 1) // seq_len  # a segment never crosses a row
        assert len(set(flat_doc[a:b].tolist())) == 1
        if flat_doc[a] >= 0:
            assert flat_pos[a:b].tolist() == list(range(b - a))


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, seq_len=st.integers(min_value=1, max_value=32))
def test_first_fit_never_needs_more_rows_than_greedy(lengths: list[int], seq_len: int) -> None:
    greedy = pack_lengths(lengths, seq_len, method="greedy")
    first_fit = pack_lengths(lengths, seq_len, method="first_fit")
    assert first_fit.rows <= greedy.rows
    assert first_fit.padding <= greedy.padding


def test_masks_follow_their_tokens_and_padding_is_masked() -> None:
    layout = pack_lengths([3, 5, 2], 6, method="first_fit")
    masks = [np.array([0, 1, 1]), np.array([0, 0, 1, 1, 1]), np.array([1, 1])]
    packed = fill(layout, _docs([3, 5, 2]), pad_id=0, masks=masks)
    assert packed.loss_mask is not None
    # first_fit: row 0 = doc 0 + doc 2 (holes filled), row 1 = doc 1.
    assert packed.doc_ids.tolist() == [[0, 0, 0, 2, 2, -1], [1, 1, 1, 1, 1, -1]]
    assert packed.loss_mask.tolist() == [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0]]
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 6, 11, 12]


# -- packed batches of a real dataset ----------------------------------------------------

GLOBAL_BATCH = 16


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 documents, log-normal lengths (1-200 tokens), tokens ``id * 1000 + i`` mod 2**31,
    a loss mask of 1 on the second half, in shards of ~8 KB."""
    out = tmp_path_factory.mktemp("docs")
    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(3.3, 0.8, 600).astype(int), 1, 200)
    columns = {"tokens": "ndarray:uint32", "loss_mask": "ndarray:uint8"}
    with MDSWriter(out, columns, size_limit=8 << 10) as writer:
        for doc, n in enumerate(lengths.tolist()):
            tokens = (np.arange(n, dtype=np.uint32) + doc * 1000).astype(np.uint32)
            mask = (np.arange(n) >= n // 2).astype(np.uint8)
            writer.write({"tokens": tokens, "loss_mask": mask})
    return out


def _dataset(
    path: Path, cache: Path, world: int, rank: int, pack: PackOptions, **kw: Any
) -> StreamingDataset:
    return StreamingDataset(
        str(path),
        batch_size=GLOBAL_BATCH // world,
        plan=PlanOptions(seed=3, num_partitions=4),
        cache=CacheOptions(dir=cache),
        decode=DecodeOptions(sample_ids=True),
        topology=Topology(rank=rank, world_size=world),
        pack=pack,
        **kw,
    )


def _global_rows(
    path: Path, cache: Path, world: int, pack: PackOptions, state: dict[str, Any] | None = None
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Every global batch's packed rows: the ranks' rows of a step, concatenated in rank
    order (what a run on ``world`` ranks reads; from ``state`` when given)."""
    per_rank = []
    for rank in range(world):
        ds = _dataset(path, cache, world, rank, pack)
        if state is not None:
            ds.load_state_dict(state)
        per_rank.append([{k: v.numpy() for k, v in b.items()} for b in ds])
    steps = []
    for batches in zip(*per_rank, strict=True):
        steps.append(
            {
                k: np.concatenate([b[k] for b in batches])
                for k in ("input_ids", "position_ids", "doc_ids", "loss_mask", "sample_id")
            }
        )
    return steps


def _assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


PACK = PackOptions(seq_len=64, rows=3, group=4, method="first_fit")


def test_packed_rows_hold_the_batch_documents(documents: Path, tmp_path: Path) -> None:
    ds = _dataset(documents, tmp_path / "c", 1, 0, PACK)
    batch = next(iter(ds))
    assert batch["input_ids"].shape == (GLOBAL_BATCH // 4 * 3, 64)
    assert batch["input_ids"].dtype == torch.uint32
    ids = batch["input_ids"].numpy().astype(np.int64)
    real = batch["doc_ids"].numpy() >= 0
    assert set((ids[real] // 1000).tolist()) <= set(batch["sample_id"].tolist())
    assert batch["cu_seqlens"][-1] == ids.size
    assert (batch["loss_mask"].numpy()[~real] == 0).all()


@pytest.mark.parametrize("pack", [PACK, PackOptions(seq_len=48, rows=4, group=2, method="greedy")])
def test_the_same_rows_on_1_2_and_4_ranks(
    documents: Path, tmp_path: Path, pack: PackOptions
) -> None:
    one = _global_rows(documents, tmp_path / "c", 1, pack)
    assert len(one) == 600 // GLOBAL_BATCH
    _assert_same(one, _global_rows(documents, tmp_path / "c", 2, pack))
    _assert_same(one, _global_rows(documents, tmp_path / "c", 4, pack))


def test_resume_on_another_world_size_continues_the_same_rows(
    documents: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    full = _global_rows(documents, cache, 1, PACK)
    ds = _dataset(documents, cache, 2, 0, PACK)
    it = iter(ds)
    for _ in range(7):
        next(it)
    state = ds.state_dict()
    assert state["batch"] == 7 and state["plan"]["pack"]["group"] == 4
    for world in (1, 4):
        _assert_same(full[7:], _global_rows(documents, cache, world, PACK, state))


def test_loader_workers_give_the_same_rows_and_resume_exactly(
    documents: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    full = _global_rows(documents, cache, 1, PACK)
    loader = ShardstreamLoader(_dataset(documents, cache, 1, 0, PACK), num_workers=2)
    got = []
    for step, batch in enumerate(loader):
        got.append({k: v.numpy().copy() for k, v in batch.items() if k != "cu_seqlens"})
        if step == 10:
            state = loader.state_dict()
            break
    loader.close()
    _assert_same(full[:11], got)
    resumed = ShardstreamLoader(_dataset(documents, cache, 1, 0, PACK), num_workers=0)
    resumed.load_state_dict(state)
    rest = [{k: v.numpy().copy() for k, v in b.items() if k != "cu_seqlens"} for b in resumed]
    _assert_same(full[11:], rest)


def test_a_resume_with_other_packing_is_refused(documents: Path, tmp_path: Path) -> None:
    ds = _dataset(documents, tmp_path / "c", 1, 0, PACK)
    state = ds.state_dict()
    other = _dataset(documents, tmp_path / "c", 1, 0, PackOptions(seq_len=128, rows=3, group=4))
    with pytest.raises(ResumeError, match="pack"):
        other.load_state_dict(state)
    unpacked = StreamingDataset(
        str(documents), batch_size=GLOBAL_BATCH, plan=PlanOptions(seed=3, num_partitions=4),
        cache=CacheOptions(dir=tmp_path / "c"), topology=Topology(0, 1),
    )  # fmt: skip
    with pytest.raises(ResumeError, match="pack"):
        unpacked.load_state_dict(state)


def test_the_default_group_is_adopted_on_resume(documents: Path, tmp_path: Path) -> None:
    pack = PackOptions(seq_len=64, rows=6)  # group: the first run's per-rank batch (8)
    ds = _dataset(documents, tmp_path / "c", 2, 0, pack)
    state = ds.state_dict()
    assert state["plan"]["pack"]["group"] == 8
    one = _dataset(documents, tmp_path / "c", 1, 0, pack)
    one.load_state_dict(state)  # 16 documents a rank: two groups of the saved 8
    assert one.state_dict()["plan"]["pack"]["group"] == 8
    four = _dataset(documents, tmp_path / "c", 4, 0, pack)
    with pytest.raises(ResumeError, match="group 8 does not divide"):
        four.load_state_dict(state)


def test_bad_pack_options_are_one_clear_error(documents: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="method"):
        PackOptions(seq_len=8, method="best")
    with pytest.raises(ConfigError, match="group 5 does not divide"):
        _dataset(documents, tmp_path / "c", 1, 0, PackOptions(seq_len=8, group=5))
    with pytest.raises(ConfigError, match="'text' is not a column"):
        _dataset(documents, tmp_path / "c", 1, 0, PackOptions(seq_len=8, column="text"))


def _in_ring(loader: ShardstreamLoader, tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lies in the worker's shared-memory ring (not pickled memory)."""
    ring = loader._pool.workers[0].ring
    offset = tensor.untyped_storage().data_ptr() - ring._addr
    return 0 <= offset < ring.slots * ring.slot_bytes


@pytest.mark.parametrize("rows", [3, None])
def test_packed_batches_travel_through_the_loaders_shared_memory(
    documents: Path, tmp_path: Path, rows: int | None
) -> None:
    pack = PackOptions(seq_len=64, rows=rows, group=4, method="first_fit")
    cache = tmp_path / "c"
    want = _global_rows(documents, cache, 1, pack)
    keys = ("input_ids", "position_ids", "doc_ids", "loss_mask")
    with ShardstreamLoader(_dataset(documents, cache, 1, 0, pack), num_workers=1) as loader:
        got, placed = [], []
        for batch in loader:
            placed.append(all(_in_ring(loader, batch[k]) for k in keys))
            got.append({k: batch[k].numpy().copy() for k in (*keys, "sample_id")})
            del batch
    _assert_same(want, got)
    assert all(placed), f"{placed.count(False)} of {len(placed)} packed batches were pickled"
