"""``shardstream import hf``: folders written by ``datasets`` (``save_to_disk``) and Parquet."""

from __future__ import annotations

import io
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from shardstream.errors import InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from tests.builder.conftest import png_bytes, read_with_ours, read_with_streaming

SMALL = {"shard_size": 8 * 1024, "allow_small_shards": True, "progress": False}
NAMES = ["cat", "dog", "fox"]


def _dataset(n: int) -> datasets.Dataset:
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=NAMES),
            "ids": datasets.Sequence(datasets.Value("int32")),
            "text": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "image": [{"bytes": png_bytes(i), "path": None} for i in range(n)],
            "label": [i % 3 for i in range(n)],
            "ids": [list(range(i % 7 + 1)) for i in range(n)],  # MDS ndarray: never empty
            "text": [f"row {i}" for i in range(n)],
        },
        features=features,
    )


def test_dataset_dict_split_comes_back_field_by_field(tmp_path: Path) -> None:
    train = _dataset(60)
    datasets.DatasetDict({"train": train, "test": _dataset(5)}).save_to_disk(str(tmp_path / "hf"))
    result = build_import(
        ImportConfig(format="hf", inputs=(str(tmp_path / "hf"),), split="train",
                     output=str(tmp_path / "out"), workers=2, **SMALL)
    )  # fmt: skip
    assert result.columns == {"ids": "ndarray", "image": "png", "label": "int", "text": "str"}
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert meta["label_names"] == {"label": NAMES}
    ours = read_with_ours(tmp_path / "out")
    theirs = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    assert len(ours) == len(theirs) == 60
    for got, other, i in zip(ours, theirs, range(60), strict=True):
        assert got["image"] == png_bytes(i)
        want_pixels = np.asarray(Image.open(io.BytesIO(png_bytes(i))))
        assert np.array_equal(np.asarray(other["image"]), want_pixels)
        assert got["label"] == other["label"] == i % 3
        assert got["ids"].dtype == np.int32 and got["ids"].tolist() == list(range(i % 7 + 1))
        assert got["text"] == other["text"] == f"row {i}"


def test_missing_split_and_hub_names_are_clear_errors(tmp_path: Path) -> None:
    datasets.DatasetDict({"train": _dataset(3)}).save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(InputError, match="splits train; choose one with --split"):
        build_import(ImportConfig(format="hf", inputs=(str(tmp_path / "hf"),), split="valid",
                                  output=str(tmp_path / "o"), **SMALL))  # fmt: skip
    with pytest.raises(InputError, match="not loaded from the Hub"):
        build_import(ImportConfig(format="hf", inputs=("imdb",), output=str(tmp_path / "o"),
                                  **SMALL))  # fmt: skip


def test_parquet_files_import_like_the_saved_folder(tmp_path: Path) -> None:
    ds = _dataset(30)
    ds.to_parquet(str(tmp_path / "part.parquet"))
    result = build_import(ImportConfig(format="hf", inputs=(str(tmp_path / "part.parquet"),),
                                       output=str(tmp_path / "out"), **SMALL))  # fmt: skip
    assert result.samples == 30 and result.metadata["label_names"] == {"label": NAMES}
    assert [s["text"] for s in read_with_ours(tmp_path / "out")] == ds["text"]


def test_plain_batches_are_columns_and_others_rows() -> None:
    """Strings and binaries come out as views of the Arrow buffers (a sliced array from
    its offset on), numbers as arrays; a null or an image feature sends the batch to rows."""
    import pyarrow as pa

    from shardstream.shard_builder.importers import hf

    text = pa.array(["a", "bc", "déf", ""]).slice(1)
    blob = pa.array([b"0", b"12", b"", b"345"], pa.large_binary()).slice(1)
    numbers = pa.array([9, -1, 2, 3], pa.int8()).slice(1)
    flags = pa.array([True, False, True, True, False, False, True, False, True]).slice(6)
    halves = pa.array([0.5, 1.5, -2.0, 4.0], pa.float16()).slice(1)
    batch = pa.RecordBatch.from_arrays(
        [text, blob, numbers, flags, halves], ["t", "b", "n", "f", "h"]
    )
    columns = hf._plain_columns(batch, {})
    assert columns is not None
    assert columns["f"][0] == "int" and columns["f"][1].tolist() == [1, 0, 1]
    assert columns["h"][0] == "float64" and columns["h"][1].tolist() == [1.5, -2.0, 4.0]
    assert [bytes(v) for v in columns["t"][1]] == [b"bc", "déf".encode(), b""]
    assert [bytes(v) for v in columns["b"][1]] == [b"12", b"", b"345"]
    assert columns["n"][0] == "int" and columns["n"][1].tolist() == [-1, 2, 3]
    with_null = pa.RecordBatch.from_arrays([pa.array(["x", None])], ["t"])
    assert hf._plain_columns(with_null, {}) is None
    image = pa.RecordBatch.from_arrays([pa.array([b"\xff\xd8\xff"])], ["img"])
    assert hf._plain_columns(image, {"img": {"_type": "Image"}}) is None


@pytest.mark.parametrize("part_bytes", [1 << 30, 20_000])
def test_a_truncated_arrow_file_is_one_error_naming_file_and_row(
    part_bytes: int, tmp_path: Path
) -> None:
    """pyarrow fails only when it reaches the missing bytes, mid-file: that failure too is
    one clear error (it escaped as a bare OSError), and nothing is published."""
    import os

    import pyarrow as pa

    table = pa.table({"text": [f"row {i} " * 20 for i in range(3000)]})
    path = tmp_path / "data.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=300)
    os.truncate(path, path.stat().st_size * 2 // 3)
    config = ImportConfig(
        format="hf", inputs=(str(path),), output=str(tmp_path / "o"), part_bytes=part_bytes,
        **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"data\.arrow row \d+: damaged Arrow/Parquet file"):
        build_import(config)
    assert not (tmp_path / "o" / "index.json").exists()


def test_a_dataset_dict_without_split_says_which_split_it_took(tmp_path: Path) -> None:
    datasets.DatasetDict({"test": _dataset(2), "train": _dataset(3)}).save_to_disk(
        str(tmp_path / "hf")
    )
    result = build_import(ImportConfig(format="hf", inputs=(str(tmp_path / "hf"),),
                                       output=str(tmp_path / "o"), **SMALL))  # fmt: skip
    assert result.samples == 3
    said = f"split 'train' of the DatasetDict {tmp_path / 'hf'} (--split not given; its splits: "
    assert said + "test, train)" in result.summary()
    chosen = build_import(ImportConfig(format="hf", inputs=(str(tmp_path / "hf"),), split="train",
                                       output=str(tmp_path / "o2"), **SMALL))  # fmt: skip
    assert "split" not in chosen.summary()
