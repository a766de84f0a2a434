"""Image decoding: every installed decoder gives Pillow's pixels, Pillow catches what the
fast ones refuse, reduced-scale decoding, and one clear error for bytes nothing decodes."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from shardstream.client import DecodeOptions
from shardstream.client.batches.image_decode import (
    ImageDecoder,
    available_decoders,
    decode_on_device,
)
from shardstream.errors import ConfigError, CorruptShardError

FAST = [name for name in available_decoders() if name != "pillow"]


def jpeg(width: int = 50, height: int = 30, mode: str = "RGB", **save: Any) -> bytes:
    rng = np.random.default_rng(width * height)
    shape = (height, width, 3) if mode in ("RGB", "CMYK") else (height, width)
    pixels = rng.integers(0, 255, shape).astype(np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90, **save)
    return buf.getvalue()


def test_the_test_environment_has_every_fast_decoder() -> None:
    assert FAST == ["torchcodec", "torchvision", "simplejpeg"]
    assert ImageDecoder().jpeg_decoder == "torchcodec"
    assert ImageDecoder(min_size=10).jpeg_decoder == "simplejpeg"


@pytest.mark.parametrize("name", FAST)
def test_fast_decoders_match_pillow(name: str) -> None:
    data = jpeg()
    reference = ImageDecoder("pillow")(data, what="x")
    hwc = ImageDecoder(name)(data, what="x")
    chw = ImageDecoder(name, layout="CHW")(data, what="x")
    assert isinstance(hwc, np.ndarray) and hwc.shape == (30, 50, 3) and hwc.dtype == np.uint8
    assert isinstance(chw, torch.Tensor) and chw.shape == (3, 30, 50)
    assert np.abs(hwc.astype(int) - reference.astype(int)).max() <= 2
    assert torch.equal(chw.permute(1, 2, 0), torch.from_numpy(np.ascontiguousarray(hwc)))


@pytest.mark.parametrize("name", [*FAST, "pillow"])
def test_grayscale_keeps_its_channel_unless_rgb_is_asked(name: str) -> None:
    data = jpeg(mode="L")
    # A channel axis in both layouts, as torchvision's decoders give a gray image.
    assert ImageDecoder(name)(data, what="x").shape == (30, 50, 1)
    assert ImageDecoder(name, layout="CHW")(data, what="x").shape == (1, 30, 50)
    assert ImageDecoder(name, mode="L")(data, what="x").shape == (30, 50, 1)
    assert ImageDecoder(name, mode="RGB")(data, what="x").shape == (30, 50, 3)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("name", [*FAST, "pillow"])
def test_every_decoder_gives_the_same_channels_as_stored(name: str, layout: str) -> None:
    """``image_mode=None``: gray 1 channel, RGB 3, RGBA 4, whichever decoder runs; what
    holds no trainable colours as stored (CMYK ink, palette indices, 1-bit) comes as RGB
    or gray, uint8."""
    rgb = Image.fromarray(np.random.default_rng(1).integers(0, 255, (30, 50, 3), np.uint8))
    cases = {
        jpeg(mode="L"): 1,
        jpeg(mode="CMYK"): 3,
        jpeg(): 3,
        _png(rgb.convert("L")): 1,
        _png(rgb.convert("P")): 3,
        _png(rgb.convert("1")): 1,
        _png(rgb.convert("RGBA")): 4,
    }
    decode = ImageDecoder(name, layout)
    for data, channels in cases.items():
        pixels = decode(data, what="x")
        shape = (30, 50, channels) if layout == "HWC" else (channels, 30, 50)
        assert tuple(pixels.shape) == shape and pixels.dtype in (np.uint8, torch.uint8)


@pytest.mark.parametrize("name", [*FAST, "pillow"])
def test_what_a_fast_decoder_refuses_pillow_decodes(name: str) -> None:
    cmyk = jpeg(mode="CMYK")  # libjpeg-turbo front ends differ on Adobe CMYK; Pillow reads it
    rgb = ImageDecoder(name, mode="RGB")(cmyk, what="x")
    assert rgb.shape == (30, 50, 3)
    png = io.BytesIO()
    Image.new("RGBA", (7, 5), (10, 20, 30, 40)).save(png, format="PNG")
    assert ImageDecoder(name, mode="RGB")(png.getvalue(), what="x").shape == (5, 7, 3)
    assert ImageDecoder(name)(png.getvalue(), what="x").shape == (5, 7, 4)


@pytest.mark.parametrize("name", [*FAST, "pillow"])
def test_bytes_nothing_decodes_name_the_sample(name: str) -> None:
    data = jpeg()
    for bad in (b"not an image at all", data[:20]):
        with pytest.raises(CorruptShardError, match="shard 3 sample 9 column 'image'"):
            ImageDecoder(name)(bad, what="shard 3 sample 9 column 'image'")


@pytest.mark.parametrize("name", ["auto", "simplejpeg", "pillow"])
def test_reduced_scale_keeps_the_shorter_side_at_least_min_size(name: str) -> None:
    data = jpeg(1600, 1200)
    full = ImageDecoder(name)(data, what="x")
    small = ImageDecoder(name, min_size=280)(data, what="x")
    assert full.shape[:2] == (1200, 1600)
    assert 280 <= min(small.shape[:2]) < 600, small.shape  # 1/4 scale: 300 x 400
    assert small.shape[:2] == (300, 400)


def test_wrong_options_are_refused_when_made() -> None:
    with pytest.raises(ConfigError, match="image_decoder must be one of"):
        DecodeOptions(image_decoder="turbo")
    with pytest.raises(ConfigError, match="torchvision cannot decode at a reduced scale"):
        DecodeOptions(image_decoder="torchvision", decode_min_size=128)
    with pytest.raises(ConfigError, match="image_layout must be"):
        DecodeOptions(image_layout="NCHW")
    with pytest.raises(ConfigError, match="image_mode must be"):
        DecodeOptions(image_mode="CMYK")


def _device_batch() -> list[bytes]:
    png = io.BytesIO()
    Image.new("RGB", (7, 5), (10, 20, 30)).save(png, format="PNG")
    return [jpeg(), png.getvalue(), jpeg(40, 20, mode="L")]


def _check_device_decode(device: str) -> None:
    batch = _device_batch()
    out = decode_on_device(batch, device)
    assert [tuple(t.shape) for t in out] == [(3, 30, 50), (3, 5, 7), (3, 20, 40)]
    assert all(t.device.type == torch.device(device).type for t in out)
    reference = ImageDecoder("pillow", mode="RGB")(batch[0], what="x")
    diff = out[0].cpu().permute(1, 2, 0).int() - torch.from_numpy(reference.copy()).int()
    assert int(diff.abs().max()) <= 3
    assert torch.equal(out[1].cpu()[:, 0, 0], torch.tensor([10, 20, 30], dtype=torch.uint8))
    with pytest.raises(CorruptShardError, match="image 1 of the batch"):
        decode_on_device([batch[0], b"junk"], device)


def test_batch_decode_on_a_device_path_runs_on_the_cpu() -> None:
    _check_device_decode("cpu")


def test_batch_decode_on_the_gpu_or_a_clear_refusal() -> None:
    # Runs everywhere: on a GPU node it decodes there; where torch sees no CUDA device
    # (this project's CI) asking for one is one clear error, not a torch traceback.
    if torch.cuda.is_available():
        _check_device_decode("cuda")
        return
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        decode_on_device([b"\xff\xd8\xff"], "cuda")
