"""The device image stage: batched decode and crop, the same boxes as the CPU path,
exact resume, and the CPU fallback for images the fast decoder refuses.

Tolerance: the stage's batched resize uses torchvision's antialiased bilinear weights in
float32; torchvision's ``resized_crop`` on ``uint8`` uses fixed-point weights, so pixels
may differ by 1 level (measured: max 1, mean 0.16). Same boxes but other decoders (nvJPEG
versus libjpeg-turbo) add a level or two; a different box would differ by tens.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    RandomResizedCropFlip,
    ShardstreamLoader,
    StreamingDataset,
)
from shardstream.client.batches.image_stage import ImageStage, _decode_torch
from shardstream.errors import ConfigError
from shardstream.shard_builder import ImageBuildConfig, build_images
from tests.fixtures.datasets import write_image_tree

N = 40
CROP = 24
AUGMENT = RandomResizedCropFlip(CROP)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stage")
    write_image_tree(root / "train", N, classes=3)
    build_images(
        ImageBuildConfig(
            output=str(root / "ds"),
            inputs=(str(root / "train"),),
            shard_size=30_000,
            allow_small_shards=True,
        )
    )
    return root / "ds"


def make(images: Path, tmp: Path, augment: Any = AUGMENT) -> StreamingDataset:
    return StreamingDataset(
        str(images / "index.json"),
        8,
        plan=PlanOptions(seed=5),
        cache=CacheOptions(dir=tmp / "cache"),
        decode=DecodeOptions(sample_ids=True, image_mode="RGB"),
        sample_transform=augment,
    )


def by_id(batches: list[dict[str, Any]]) -> dict[int, torch.Tensor]:
    return {
        int(i): image.cpu()
        for batch in batches
        for i, image in zip(batch["sample_id"].tolist(), batch["image"], strict=True)
    }


def reference_crop(image: torch.Tensor, box: tuple[int, ...]) -> torch.Tensor:
    top, left, h, w, flip = box
    out = F.resized_crop(image, top, left, h, w, [CROP, CROP], antialias=True)
    return F.horizontal_flip(out) if flip else out


def test_batched_crop_on_cpu_equals_a_per_image_reference() -> None:
    g = torch.Generator().manual_seed(0)
    pictures, boxes = [], []
    for k in range(48):
        h, w = (int(x) for x in torch.randint(12, 120, (2,), generator=g))
        picture = torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g)
        pictures.append(F.gaussian_blur(picture, [5, 5]) if k % 2 else picture)
        boxes.append(AUGMENT.draw(h, w, torch.Generator().manual_seed(k)))
    assert any(b[4] for b in boxes) and not all(b[4] for b in boxes)  # both flips seen
    out = ImageStage(AUGMENT, "cpu").crop(pictures, torch.tensor(boxes))
    expected = torch.stack([reference_crop(p, b) for p, b in zip(pictures, boxes, strict=True)])
    diff = (out.int() - expected.int()).abs()
    assert out.shape == expected.shape and out.dtype == torch.uint8
    assert int(diff.max()) <= 1 and float(diff.float().mean()) < 0.3


def test_draw_picks_torchvisions_boxes_for_the_same_seed() -> None:
    crop, flip = v2.RandomResizedCrop(CROP), v2.RandomHorizontalFlip()
    for seed in range(200):
        h, w = 30 + seed % 70, 200 - seed % 90
        torch.manual_seed(seed)
        params = crop.make_params([torch.empty(3, h, w)])
        flipped = int(torch.rand(1).item() < flip.p)
        ours = AUGMENT.draw(h, w, torch.Generator().manual_seed(seed))
        assert ours == (params["top"], params["left"], params["height"], params["width"], flipped)


def test_cpu_path_and_device_stage_choose_the_same_boxes(images: Path, tmp_path: Path) -> None:
    with ShardstreamLoader(make(images, tmp_path), num_workers=2) as loader:
        cpu_path = by_id(list(loader))
    with ShardstreamLoader(make(images, tmp_path), num_workers=2, device="cpu") as loader:
        staged = by_id(list(loader))
    assert sorted(staged) == sorted(cpu_path) == list(range(N))
    for sid, image in staged.items():
        diff = (image.int() - cpu_path[sid].int()).abs()
        assert int(diff.max()) <= 1, f"sample {sid}: another box or flip"


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_the_stage_is_bitwise_exact(
    images: Path, tmp_path: Path, workers: int
) -> None:
    def loader() -> ShardstreamLoader:
        return ShardstreamLoader(make(images, tmp_path), num_workers=workers, device="cpu")

    with loader() as full:
        reference = [b for epoch in range(2) for b in (full.set_epoch(epoch), list(full))[1]]
    for cut in (0, 3, 5, 7):  # 5 batches an epoch: mid-epoch, the boundary, the next
        with loader() as first:
            head: list[dict[str, Any]] = []
            for epoch in range(2):
                first.set_epoch(epoch)
                batches = iter(first)
                while len(head) < cut and (batch := next(batches, None)) is not None:
                    head.append(batch)
                if len(head) == cut:
                    break
            state = first.state_dict()
        with loader() as second:
            second.load_state_dict(state)
            tail = []
            for epoch in range(second.epoch, 2):
                second.set_epoch(epoch)
                tail.extend(second)
        got = head + tail
        assert len(got) == len(reference), f"cut {cut}"
        for a, b in zip(got, reference, strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"cut {cut}"


def _encoded(mode: str, fmt: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (30 + seed, 40, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, fmt)
    return buf.getvalue()


def test_images_the_fast_decoder_refuses_are_decoded_on_the_cpu() -> None:
    """nvJPEG refuses CMYK JPEGs; this decoder wraps the real one and does the same, so
    the fallback runs on any machine. PNGs never reach a JPEG decoder."""
    calls: list[int] = []

    def refuses_cmyk(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        calls.append(len(data))
        for tensor in data:
            if Image.open(io.BytesIO(bytes(tensor.numpy()))).mode == "CMYK":
                raise RuntimeError("unsupported colour space")
        return _decode_torch(data, device)

    encoded = [
        _encoded("RGB", "JPEG", 0),
        _encoded("CMYK", "JPEG", 1),
        _encoded("L", "JPEG", 2),
        _encoded("RGB", "PNG", 3),
        _encoded("RGBA", "PNG", 4),
    ]
    stage = ImageStage(AUGMENT, "cpu", jpeg_decoder=refuses_cmyk)
    decoded = stage.decode([torch.frombuffer(bytearray(e), dtype=torch.uint8) for e in encoded])
    assert calls[0] == 3  # the batch's three JPEGs in one call, then one by one
    assert len(decoded) == len(encoded)
    for data, image in zip(encoded, decoded, strict=True):
        expected = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        assert image.shape == expected.permute(2, 0, 1).shape
        diff = (image.int() - expected.permute(2, 0, 1).int()).abs().float().mean()
        assert float(diff) < 2.0


def test_the_stage_needs_its_augmentation(images: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RandomResizedCropFlip"):
        ShardstreamLoader(make(images, tmp_path, augment=lambda s: s), device="cpu")


def test_cuda_stage_where_a_gpu_exists(images: Path, tmp_path: Path) -> None:
    """Runs everywhere: without CUDA, device="cuda" must be refused with a clear error;
    with CUDA, the GPU stage must give the CPU stage's images (decoders may differ by a
    few levels). This test never skips: on a CPU-only machine it asserts the refusal."""
    with ShardstreamLoader(make(images, tmp_path), num_workers=1, device="cpu") as loader:
        on_cpu = by_id(list(loader))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            ShardstreamLoader(make(images, tmp_path), device="cuda")
        return
    with ShardstreamLoader(make(images, tmp_path), num_workers=1, device="cuda") as loader:
        batches = list(loader)
    assert all(b["image"].is_cuda and b["sample_id"].is_cuda for b in batches)
    on_gpu = by_id(batches)
    assert sorted(on_gpu) == sorted(on_cpu)
    for sid, image in on_gpu.items():
        diff = (image.int() - on_cpu[sid].int()).abs().float().mean()
        assert float(diff) < 4.0, f"sample {sid}: mean difference {float(diff):.2f}"
