"""``shardstream import litdata``: folders written with ``litdata.optimize``, general items
and token chunks, from a local folder or an ``s3://`` prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from litdata import StreamingDataset, TokensLoader, optimize

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from shardstream.storage import open_store
from tests.builder.conftest import read_with_ours, read_with_streaming
from tests.fixtures.s3 import S3Bucket

SMALL = {"shard_size": 4 * 1024, "allow_small_shards": True, "progress": False}


def _item(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"sample-{i}",
        "score": i / 7,
        "blob": bytes([i % 256]) * (i % 9),
        "arr": np.arange(i % 5 + 1, dtype=np.int32) * i,
    }


def _tokens(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(37 + i, dtype=np.uint16) * 3 + i).astype(np.uint16)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("litdata")
    kwargs: dict[str, Any] = {"num_workers": 1, "verbose": False}
    optimize(fn=_item, inputs=list(range(120)), output_dir=str(root / "gen"),
             chunk_bytes="4KB", **kwargs)  # fmt: skip
    optimize(fn=_tokens, inputs=list(range(40)), output_dir=str(root / "tok"),
             chunk_size=512, item_loader=TokensLoader(), **kwargs)  # fmt: skip
    return root


def test_general_items_come_back_field_by_field(written: Path, tmp_path: Path) -> None:
    config = ImportConfig(
        format="litdata", inputs=(str(written / "gen"),), output=str(tmp_path / "out"), **SMALL
    )
    result = build_import(config)
    assert result.columns == {
        "arr": "ndarray", "blob": "bytes", "id": "int", "name": "str", "score": "float64",
    }  # fmt: skip
    assert len(result.shards) > 2
    theirs = StreamingDataset(str(written / "gen"), shuffle=False)
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == len(theirs) == 120
    for i, sample in enumerate(ours):
        want = theirs[i]
        assert sample["id"] == want["id"] and sample["name"] == want["name"]
        assert sample["score"] == want["score"] and sample["blob"] == want["blob"]
        got_arr = np.asarray(sample["arr"])
        assert np.array_equal(got_arr, np.asarray(want["arr"]))


def test_token_chunks_become_a_token_dataset(written: Path, tmp_path: Path) -> None:
    bare = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), output=str(tmp_path / "x"), **SMALL
    )
    with pytest.raises(InputError, match="give --seq-len N"):
        build_import(bare)
    config = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), seq_len=32,
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    result = build_import(config)
    assert result.columns == {"tokens": "ndarray:uint16:32"}
    theirs = StreamingDataset(str(written / "tok"), item_loader=TokensLoader(block_size=32))
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == len(theirs) > 10
    for i, sample in enumerate(ours):
        assert np.array_equal(sample["tokens"], np.asarray(theirs[i]))
    # MosaicML reads the same token samples.
    mosaic = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    assert [m["tokens"].tolist() for m in mosaic] == [s["tokens"].tolist() for s in ours]


def test_token_items_import_as_documents_that_pack_at_read_time(
    written: Path, tmp_path: Path
) -> None:
    from shardstream.client import CacheOptions, PackOptions, StreamingDataset

    config = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), documents=True,
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    result = build_import(config)
    # One variable-length token array per item, as `build text --documents` writes them.
    assert result.columns == {"tokens": "ndarray:uint16"}
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == 40
    for i, sample in enumerate(ours):
        assert sample["tokens"].dtype == np.uint16
        assert np.array_equal(sample["tokens"], _tokens(i))
    # Read in small parts by several workers: the same documents.
    parts = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), documents=True, part_bytes=300,
        workers=2, output=str(tmp_path / "parts"), **SMALL,
    )  # fmt: skip
    build_import(parts)
    assert [s["tokens"].tolist() for s in read_with_ours(tmp_path / "parts")] == [
        s["tokens"].tolist() for s in ours
    ]
    # The read-time packer takes the import: every document's tokens, once each, in rows.
    ds = StreamingDataset(
        str(tmp_path / "out"), batch_size=8, pack=PackOptions(seq_len=64),
        cache=CacheOptions(dir=tmp_path / "cache"),
    )  # fmt: skip
    placed = sum(int((b["doc_ids"] >= 0).sum()) for b in ds)
    assert placed == sum(len(_tokens(i)) for i in range(40))
    # General items are no token documents.
    general = ImportConfig(
        format="litdata", inputs=(str(written / "gen"),), documents=True,
        output=str(tmp_path / "g"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match="--documents imports LitData token datasets"):
        build_import(general)


def _signed_tokens(i: int) -> np.ndarray[Any, Any]:
    tokens = np.arange(5 + i, dtype=np.int32)
    if i == 3:
        tokens[2] = -1  # no token id
    return tokens


@pytest.mark.parametrize("vocab", [65_536, 70_000])
def test_documents_with_a_vocab_size_are_checked_and_stored_in_its_dtype(
    written: Path, tmp_path: Path, vocab: int
) -> None:
    # As `import hf --documents --vocab-size N`: uint16 up to 65,536 ids, else uint32.
    config = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), documents=True, vocab_size=vocab,
        part_bytes=300, workers=2, output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    dtype = "uint16" if vocab <= 65_536 else "uint32"
    assert build_import(config).columns == {"tokens": f"ndarray:{dtype}"}
    ours = read_with_ours(tmp_path / "out")
    assert [s["tokens"].dtype.name for s in ours] == [dtype] * 40
    assert [s["tokens"].tolist() for s in ours] == [_tokens(i).tolist() for i in range(40)]


def test_an_id_outside_the_vocab_is_one_error_naming_item_and_token(
    written: Path, tmp_path: Path
) -> None:
    # Item 0's tokens are 0, 3, 6, ...: token 34 (102) is the first id >= 100.
    small = ImportConfig(
        format="litdata", inputs=(str(written / "tok"),), documents=True, vocab_size=100,
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"tok item 0: token 34 is 102, outside the vocabulary"):
        build_import(small)
    assert not (tmp_path / "out" / "index.json").exists()
    # A negative id in a signed token folder, in a later item.
    optimize(fn=_signed_tokens, inputs=list(range(6)), output_dir=str(tmp_path / "signed"),
             chunk_size=64, item_loader=TokensLoader(), num_workers=1, verbose=False)  # fmt: skip
    signed = ImportConfig(
        format="litdata", inputs=(str(tmp_path / "signed"),), documents=True, vocab_size=1000,
        output=str(tmp_path / "out2"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"signed item 3: token 2 is -1, outside the vocab"):
        build_import(signed)
    # Without --documents the option means nothing: refused, not ignored.
    with pytest.raises(ConfigError, match="vocab-size applies to hf and litdata --documents"):
        ImportConfig(format="litdata", inputs=("x",), seq_len=8, vocab_size=100, output="o")


def test_an_s3_prefix_imports_like_the_folder(
    written: Path, tmp_path: Path, s3_bucket: S3Bucket
) -> None:
    store = open_store(f"{s3_bucket.url}/lit/gen")
    for path in sorted((written / "gen").iterdir()):
        store.upload(path, path.name)
    local = ImportConfig(
        format="litdata", inputs=(str(written / "gen"),), output=str(tmp_path / "a"), **SMALL
    )
    remote = ImportConfig(
        format="litdata", inputs=(f"{s3_bucket.url}/lit/gen",), output=str(tmp_path / "b"),
        **SMALL,
    )  # fmt: skip
    build_import(local)
    build_import(remote)
    a, b = read_with_ours(tmp_path / "a"), read_with_ours(tmp_path / "b")
    assert len(a) == len(b) == 120
    assert [s["name"] for s in a] == [s["name"] for s in b]


def test_a_folder_that_is_not_litdata_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "nope").mkdir()
    config = ImportConfig(
        format="litdata", inputs=(str(tmp_path / "nope"),), output=str(tmp_path / "o"), **SMALL
    )
    with pytest.raises(InputError, match="nope: not a LitData optimized folder"):
        build_import(config)
