"""ShardstreamLoader's slot hand-off: batches lent as views of the workers' shared memory.

With ``copy=True`` a batch is a view of its worker's ring slot, which goes back to the
worker once the batch is garbage collected; the worker reuses the slot freed last (its
pages are already backed), and a training loop that keeps its batches gets copies past a
limit instead of stalling the workers. (Which slot a worker takes depends on timing, so
the benchmark, not a test, shows the page faults saved: docs/benchmarks.md#images.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardstream.client import ShardstreamLoader
from tests.fixtures.datasets import ids_of, token_row
from tests.fixtures.loader_data import dataset


def _slot_of(loader: ShardstreamLoader, tensor: torch.Tensor) -> int | None:
    """The ring slot ``tensor`` lies in, or None for private memory (a copy)."""
    ring = loader._pool.workers[0].ring
    offset = tensor.untyped_storage().data_ptr() - ring._addr
    if 0 <= offset < ring.slots * ring.slot_bytes:
        return offset // ring.slot_bytes
    return None


def _check(batch: dict[str, torch.Tensor]) -> None:
    for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
        assert row.tolist() == token_row(i).tolist(), f"sample {i} changed"


def test_batches_are_lent_views_of_the_ring(
    tokens_dir: Path,
    tmp_path: Path,
) -> None:
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=1, prefetch=4) as loader:
        slots = []
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                _check(batch)
                slots.append(_slot_of(loader, batch["tokens"]))
                del batch  # the training loop drops each batch after its step
        assert None not in slots, "a batch was copied although the ring had room"


def test_kept_batches_stay_intact_and_past_the_limit_are_copies(
    tokens_dir: Path,
    tmp_path: Path,
) -> None:
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=2, prefetch=4) as loader:
        kept = list(loader)  # far more batches than slots: workers must not stall
        loader.set_epoch(1)
        second = list(loader)  # a new pass while epoch 0's lent slots are still held
    for batch in [*kept, *second]:
        _check(batch)
    assert [ids_of(b) for b in kept] == [
        ids_of(b) for b in dataset(tokens_dir, tmp_path)
    ]  # order as the plain dataset's


@pytest.mark.parametrize("workers", [1, 2])
def test_a_batch_held_across_a_new_pass_is_not_overwritten(
    tokens_dir: Path,
    tmp_path: Path,
    workers: int,
) -> None:
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=workers) as loader:
        held = next(iter(loader))  # lent: the pass is abandoned with its slot out
        assert _slot_of(loader, held["tokens"]) is not None
        for epoch in (1, 2):
            loader.set_epoch(epoch)
            for batch in loader:
                _check(batch)
        _check(held)
