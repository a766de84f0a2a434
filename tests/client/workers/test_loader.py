"""ShardstreamLoader: order, exact O(1) resume, worker failures, the shared-memory ring."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    ShardstreamLoader,
    StreamingDataset,
    WorkerError,
)
from shardstream.errors import ConfigError
from tests.fixtures.datasets import check_resume, ids_of, token_row
from tests.fixtures.loader_data import N, dataset


def test_loader_yields_the_datasets_batches_in_order(tokens_dir: Path, tmp_path: Path) -> None:
    reference = [[ids_of(b) for b in dataset(tokens_dir, tmp_path)] for _ in range(1)]
    second = dataset(tokens_dir, tmp_path)
    second.set_epoch(1)
    reference.append([ids_of(b) for b in second])
    for workers in (0, 1, 3):
        with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=workers) as loader:
            got = []
            for epoch in range(2):
                loader.set_epoch(epoch)
                got.append([ids_of(b) for b in loader])
            assert got == reference, f"num_workers={workers}"


def test_batches_hold_the_right_values(tokens_dir: Path, tmp_path: Path) -> None:
    ds = dataset(tokens_dir, tmp_path, decode=DecodeOptions(sample_ids=True))
    with ShardstreamLoader(ds, num_workers=2) as loader:
        for batch in loader:
            assert batch["tokens"].dtype == torch.uint16
            for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
                assert row.tolist() == token_row(i).tolist()
            assert batch["sample_id"].tolist() == batch["id"].tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_state_dict_resumes_exactly(tokens_dir: Path, tmp_path: Path, workers: int) -> None:
    n = N // 4
    check_resume(
        lambda: ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=workers),
        2,
        cuts=[0, 1, 17, n - 1, n, n + 5],
    )


def test_state_counts_consumed_not_prefetched(tokens_dir: Path, tmp_path: Path) -> None:
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=2, prefetch=8) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        time.sleep(0.3)  # let the workers run ahead
        assert loader.state_dict()["batch"] == 3


def test_resume_with_other_worker_count(tokens_dir: Path, tmp_path: Path) -> None:
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=0) as ref:
        reference = [ids_of(b) for b in ref]
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=2) as first:
        it = iter(first)
        head = [ids_of(next(it)) for _ in range(11)]
        state = first.state_dict()
    with ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=3) as second:
        second.load_state_dict(state)
        assert head + [ids_of(b) for b in second] == reference


def test_views_without_copy_are_valid_until_next(tokens_dir: Path, tmp_path: Path) -> None:
    with ShardstreamLoader(
        dataset(tokens_dir, tmp_path), num_workers=1, prefetch=2, copy=False
    ) as loader:
        for batch in loader:
            for i, row in zip(batch["id"].tolist(), batch["tokens"], strict=True):
                assert row.tolist() == token_row(i).tolist()


def test_worker_exception_reaches_the_trainer(tokens_dir: Path, tmp_path: Path) -> None:
    def explode(batch: dict[str, object]) -> dict[str, object]:
        raise ValueError("bad transform")

    with (
        ShardstreamLoader(
            dataset(tokens_dir, tmp_path, transform=explode), num_workers=2
        ) as loader,
        pytest.raises(WorkerError, match="bad transform"),
    ):
        next(iter(loader))


def test_killed_worker_is_reported_and_leaves_no_shm(tokens_dir: Path, tmp_path: Path) -> None:
    before = set(os.listdir("/dev/shm"))
    loader = ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=2, prefetch=2)
    it = iter(loader)
    next(it)
    assert set(os.listdir("/dev/shm")) == before  # anonymous mappings only
    os.kill(loader._pool.workers[1].proc.pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match="exited with code -9"):
        for _ in it:
            pass
    loader.close()
    # A fresh pass starts new workers and continues from the consumed position.
    position = loader.state_dict()["batch"]
    rest = [ids_of(b) for b in loader]
    assert len(rest) == N // 4 - position
    loader.close()
    assert set(os.listdir("/dev/shm")) == before


def test_bad_arguments_and_states(tokens_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="num_workers"):
        ShardstreamLoader(dataset(tokens_dir, tmp_path), num_workers=-1)
    ds = dataset(tokens_dir, tmp_path, plan=PlanOptions(seed=3))
    with pytest.raises(ConfigError, match="run id"):
        ShardstreamLoader(ds).commit(1)


def test_transform_outputs_and_images_travel_from_workers(tokens_dir: Path, tmp_path: Path) -> None:
    """Values that are not in the ring (new tensors, lists, decoded images) arrive intact."""

    def shift(batch: dict[str, object]) -> dict[str, object]:
        tokens = batch["tokens"]
        ids = batch["id"]
        assert isinstance(tokens, torch.Tensor) and isinstance(ids, torch.Tensor)
        return {"x": tokens[:, :-1].long(), "y": tokens[:, 1:].long(), "id": ids, "n": len(ids)}

    with ShardstreamLoader(dataset(tokens_dir, tmp_path, transform=shift), num_workers=2) as loader:
        for batch in loader:
            assert batch["n"] == 4 and batch["x"].dtype == torch.int64
            for i, x, y in zip(batch["id"].tolist(), batch["x"], batch["y"], strict=True):
                assert x.tolist() == token_row(i)[:-1].tolist()
                assert y.tolist() == token_row(i)[1:].tolist()

    from tests.fixtures.datasets import write_images

    write_images(tmp_path / "img", 24)
    images = StreamingDataset(str(tmp_path / "img"), 4, cache=CacheOptions(dir=tmp_path / "cache"))
    with ShardstreamLoader(images, num_workers=2) as loader:
        seen = []
        for batch in loader:
            assert batch["png"].shape == (4, 4, 6, 3)
            for i, png in zip(batch["id"].tolist(), batch["png"], strict=True):
                assert bool((png == i).all())
            seen += ids_of(batch)
    assert sorted(seen) == list(range(24))
