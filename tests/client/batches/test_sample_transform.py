"""Per-sample transforms: torchvision v2 augmentations in the workers, collated into
shared memory, and replayed bit for bit on resume and on another world size."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    ShardstreamLoader,
    StreamingDataset,
    Topology,
)
from shardstream.client.batches.sample_transform import sample_seed
from shardstream.errors import ConfigError
from shardstream.shard_builder import ImageBuildConfig, build_images
from tests.fixtures.datasets import write_image_tree

N = 48
CROP = 32


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vision")
    write_image_tree(root / "train", N, classes=3)
    build_images(
        ImageBuildConfig(
            output=str(root / "ds"),
            inputs=(str(root / "train"),),
            shard_size=40_000,
            allow_small_shards=True,
        )
    )
    return root / "ds"


AUGMENT = v2.Compose([v2.RandomResizedCrop(CROP, antialias=True), v2.RandomHorizontalFlip()])


def augment(sample: dict[str, Any]) -> dict[str, Any]:
    return {"image": AUGMENT(sample["image"]), "label": sample["label"], "id": sample["sample_id"]}


def make(images: Path, tmp: Path, **kw: Any) -> StreamingDataset:
    kw.setdefault("plan", PlanOptions(seed=11))
    return StreamingDataset(
        str(images / "index.json"),
        kw.pop("batch_size", 8),
        cache=CacheOptions(dir=tmp / "cache"),
        decode=kw.pop("decode", DecodeOptions(sample_ids=True)),
        sample_transform=kw.pop("sample_transform", augment),
        **kw,
    )


def by_id(batches: list[Mapping[str, Any]]) -> dict[int, torch.Tensor]:
    return {
        int(i): img for b in batches for i, img in zip(b["id"].tolist(), b["image"], strict=True)
    }


def test_transformed_samples_are_collated_into_tensors(images: Path, tmp_path: Path) -> None:
    batch = next(iter(make(images, tmp_path)))
    assert batch["image"].shape == (8, 3, CROP, CROP) and batch["image"].dtype == torch.uint8
    assert batch["label"].dtype == torch.int64 and batch["id"].dtype == torch.int64
    assert set(batch["label"].tolist()) <= {0, 1, 2}
    # The label survives the transform: class k's images were generated with hue k.
    for image, label in zip(batch["image"], batch["label"].tolist(), strict=True):
        assert int(image.float().mean(dim=(1, 2)).argmax()) == label


def test_augmentations_depend_on_the_seed_and_replay_exactly(images: Path, tmp_path: Path) -> None:
    first = list(make(images, tmp_path))
    again = list(make(images, tmp_path))
    other = list(make(images, tmp_path, plan=PlanOptions(seed=12)))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(first, again, strict=True))
    a, b = by_id(first), by_id(other)
    differ = sum(not torch.equal(a[i], b[i]) for i in a)
    assert differ > N // 2, "another seed must draw other crops"


def test_resumed_batches_are_bitwise_identical(images: Path, tmp_path: Path) -> None:
    ds = make(images, tmp_path)
    reference = list(ds)
    head = make(images, tmp_path)
    it = iter(head)
    for _ in range(2):
        next(it)
    state = head.state_dict()
    resumed = make(images, tmp_path)
    resumed.load_state_dict(state)
    tail = list(resumed)
    assert len(tail) == len(reference) - 2
    for a, b in zip(reference[2:], tail, strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["id"], b["id"])


def test_a_sample_gets_the_same_augmentation_on_any_world_size(
    images: Path, tmp_path: Path
) -> None:
    single = by_id(list(make(images, tmp_path, batch_size=8)))
    for rank in range(2):
        ds = make(images, tmp_path, batch_size=4, topology=Topology(rank=rank, world_size=2))
        for sid, image in by_id(list(ds)).items():
            assert torch.equal(image, single[sid]), f"sample {sid} on rank {rank} of 2"


def test_fast_loader_workers_match_the_training_process(images: Path, tmp_path: Path) -> None:
    reference = list(make(images, tmp_path))
    with ShardstreamLoader(make(images, tmp_path), num_workers=2) as loader:
        fast = list(loader)
    assert len(fast) == len(reference)
    for a, b in zip(reference, fast, strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_the_trainers_random_streams_are_left_alone(images: Path, tmp_path: Path) -> None:
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    expected = (torch.rand(4), random.random(), np.random.rand())
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    next(iter(make(images, tmp_path)))  # in this process: it seeds per sample
    assert torch.equal(torch.rand(4), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_plain_callables_see_every_column(images: Path, tmp_path: Path) -> None:
    seen: list[set[str]] = []

    def plain(sample: dict[str, Any]) -> dict[str, Any]:
        seen.append(set(sample))
        img = sample["image"]
        assert isinstance(img, torch.Tensor) and img.ndim == 3 and img.shape[0] == 3
        assert isinstance(sample["label"], int) and isinstance(sample["sample_id"], int)
        return {"size": float(img.shape[1] * img.shape[2]), "name": f"s{sample['sample_id']}"}

    batch = next(iter(make(images, tmp_path, sample_transform=plain)))
    assert seen[0] == {"image", "label", "sample_id"}
    assert batch["size"].dtype == torch.float64 and len(batch["name"]) == 8


def test_a_transform_that_does_not_return_a_dict_is_named(images: Path, tmp_path: Path) -> None:
    ds = make(images, tmp_path, sample_transform=lambda s: s["image"])
    with pytest.raises(ConfigError, match="sample_transform must return a dict"):
        next(iter(ds))


def test_sample_seeds_spread_over_every_part() -> None:
    seeds = {
        sample_seed(s, e, b, i) for s in (0, 1) for e in (0, 1) for b in (0, 1) for i in range(50)
    }
    assert len(seeds) == 2 * 2 * 2 * 50
    assert all(0 <= s < 2**63 for s in seeds)


def test_transformed_batches_travel_through_the_shared_ring(images: Path, tmp_path: Path) -> None:
    with ShardstreamLoader(make(images, tmp_path), num_workers=1, copy=False) as loader:
        batch = next(iter(loader))
        ring = loader._pool.workers[0].ring
        start = ring.slot_view(0).ctypes.data
        end = start + ring.slots * ring.slot_bytes
        assert start <= batch["image"].data_ptr() < end, "the batch was pickled, not placed"
