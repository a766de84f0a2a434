"""Image builds from a class-per-folder tree and from Parquet, read back by both readers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardstream.shard_builder import ImageBuildConfig, build_images
from tests.builder.conftest import (
    dir_bytes,
    jpeg_bytes,
    png_bytes,
    read_with_ours,
    read_with_streaming,
)


def _config(tmp_path: Path, *inputs: Path, **kw: object) -> ImageBuildConfig:
    opts: dict[str, object] = {
        "output": str(tmp_path / "out"),
        "inputs": tuple(str(i) for i in inputs),
        "shard_size": 8192,
        "allow_small_shards": True,
        "workers": 1,
        "progress": False,
    }
    opts.update(kw)
    return ImageBuildConfig(**opts)  # type: ignore[arg-type]


def test_folder_stores_original_bytes_with_labels(tmp_path: Path, image_folder: Path) -> None:
    result = build_images(_config(tmp_path, image_folder, shard_size=24 << 10))
    out = tmp_path / "out"
    assert result.columns == {"image": "jpeg", "label": "int"}
    assert result.label_names == ("cat", "dog", "zebra")
    expected = [
        (p.read_bytes(), label)
        for label, name in enumerate(["cat", "dog", "zebra"])
        for p in sorted((image_folder / name).iterdir())
    ]
    ours = read_with_ours(out)
    assert [(s["image"], s["label"]) for s in ours] == expected
    theirs = read_with_streaming(out, tmp_path / "cache")
    assert [s["label"] for s in theirs] == [label for _, label in expected]
    first = theirs[0]["image"]
    assert isinstance(first, Image.Image) and first.size == (40, 32)

    sizes = [s.raw_data.bytes for s in result.shards]
    assert len(sizes) == 3 and all(0.9 * 24576 <= n <= 24576 for n in sizes[:-1]), sizes
    meta = json.loads((out / "shardstream.json").read_text())
    assert meta["label_names"] == ["cat", "dog", "zebra"]
    assert meta["lineage"][0]["files"] == 36


def test_resize_reencodes_and_png_keeps_png(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    (root / "big").mkdir(parents=True)
    (root / "small").mkdir()
    (root / "big" / "a.jpg").write_bytes(jpeg_bytes(1, (200, 100)))
    (root / "small" / "b.png").write_bytes(png_bytes(2, (20, 30)))
    result = build_images(_config(tmp_path, root, resize=50))
    assert result.columns["image"] == "jpeg"  # mixed formats: decoded by content
    samples = read_with_ours(tmp_path / "out")
    big = Image.open(io.BytesIO(samples[0]["image"]))  # type: ignore[arg-type]
    assert big.format == "JPEG" and big.size == (100, 50)
    small = samples[1]["image"]
    assert small == (root / "small" / "b.png").read_bytes()  # not larger than 50: untouched


def test_parquet_with_string_labels_and_hf_struct(tmp_path: Path) -> None:
    images = [jpeg_bytes(i) for i in range(30)]
    labels = ["tiger", "ant", "bee"] * 10
    pq.write_table(
        pa.table({"img": images[:20], "name": labels[:20]}),
        tmp_path / "a.parquet",
        row_group_size=7,
    )
    struct = pa.array(
        [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images[20:])],
        type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    pq.write_table(pa.table({"img": struct, "name": labels[20:]}), tmp_path / "b.parquet")
    config = _config(
        tmp_path, tmp_path / "*.parquet", image_field="img", label_field="name", workers=2
    )
    result = build_images(config)
    assert result.label_names == ("ant", "bee", "tiger")
    assert result.columns == {"image": "jpeg", "label": "int"}
    samples = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    names = [result.label_names[int(s["label"])] for s in samples]  # type: ignore[call-overload]
    assert names == labels
    ours = read_with_ours(tmp_path / "out")
    assert [s["image"] for s in ours] == images

    # One worker or two: the same bytes.
    again = build_images(
        _config(
            tmp_path,
            tmp_path / "*.parquet",
            image_field="img",
            label_field="name",
            output=str(tmp_path / "out1"),
        )
    )
    assert dir_bytes(tmp_path / "out1") == dir_bytes(tmp_path / "out")
    assert again.index.to_json() == result.index.to_json()


def test_parquet_int_labels_keep_hf_class_names(tmp_path: Path) -> None:
    table = pa.table({"image": [png_bytes(i) for i in range(5)], "label": [0, 1, 1, 0, 1]})
    hf = {"info": {"features": {"label": {"_type": "ClassLabel", "names": ["no", "yes"]}}}}
    table = table.replace_schema_metadata({"huggingface": json.dumps(hf)})
    pq.write_table(table, tmp_path / "d.parquet")
    result = build_images(_config(tmp_path, tmp_path / "d.parquet"))
    assert result.columns == {"image": "png", "label": "int"}
    assert result.label_names == ("no", "yes")
    assert [s["label"] for s in read_with_ours(tmp_path / "out")] == [0, 1, 1, 0, 1]


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_null_image_in_parquet(tmp_path: Path, policy: str) -> None:
    pq.write_table(
        pa.table({"image": [jpeg_bytes(0), None, jpeg_bytes(2)], "label": [0, 1, 2]}),
        tmp_path / "d.parquet",
    )
    config = _config(tmp_path, tmp_path / "d.parquet", on_bad_image=policy)
    if policy == "fail":
        with pytest.raises(Exception, match=r"d\.parquet row 1: the image value is null"):
            build_images(config)
    else:
        result = build_images(config)
        assert result.samples == 2
        assert result.skipped[0].source.endswith("d.parquet row 1")


def _mixed_tree(root: Path) -> dict[str, int]:
    """A class tree with RGB, grayscale and CMYK JPEGs and an RGBA PNG among them; the
    channels each has as stored (CMYK decodes to RGB)."""
    rgb = Image.open(io.BytesIO(jpeg_bytes(5, (40, 32)))).convert("RGB")
    files = {
        "a/0.jpg": (rgb, "JPEG", 3),
        "a/1.jpg": (rgb.convert("L"), "JPEG", 1),
        "b/2.jpg": (rgb.convert("CMYK"), "JPEG", 3),
        "b/3.png": (rgb.convert("RGBA"), "PNG", 4),
    }
    for name, (image, fmt, _) in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / name, format=fmt)
    return {name: channels for name, (_, _, channels) in files.items()}


def test_a_mixed_jpeg_png_tree_decodes_in_both_readers(tmp_path: Path) -> None:
    from shardstream.client import DecodeOptions, PlanOptions, StreamingDataset

    root = tmp_path / "imgs"
    channels = _mixed_tree(root)
    result = build_images(_config(tmp_path, root))
    assert result.columns == {"image": "jpeg", "label": "int"}
    assert "undecoded" not in result.summary()
    plan = PlanOptions(shuffle=False)
    for layout in ("HWC", "CHW"):
        decode = DecodeOptions(image_layout=layout)
        ds = StreamingDataset(str(tmp_path / "out"), batch_size=1, plan=plan, decode=decode)
        shapes = [tuple(batch["image"][0].shape) for batch in ds]
        want = [(32, 40, c) if layout == "HWC" else (c, 32, 40) for c in channels.values()]
        assert shapes == want
    rgb = DecodeOptions(image_mode="RGB", image_layout="CHW")
    ds = StreamingDataset(str(tmp_path / "out"), batch_size=4, plan=plan, decode=rgb)
    assert tuple(next(iter(ds))["image"].shape) == (4, 3, 32, 40)  # one stacked tensor
    theirs = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    assert [s["image"].format for s in theirs] == ["JPEG", "JPEG", "JPEG", "PNG"]


def test_a_column_stored_undecoded_is_named_with_the_flag(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "imgs"
    _mixed_tree(root)
    args = [sys.executable, "-m", "shardstream", "build", "images", str(root), "--no-progress"]
    args += ["--output", str(tmp_path / "out"), "--image-format", "bytes"]
    args += ["--shard-size", "8192", "--allow-small-shards", "--workers", "1"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "column 'image' is stored as bytes" in done.stderr
    assert "--image-format auto" in done.stderr
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert meta["columns"]["image"] == "bytes" and "undecoded" in meta["notes"][0]
