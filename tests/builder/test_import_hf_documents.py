"""``shardstream import hf --documents``: each row's ``input_ids`` as one document."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest

from shardstream.errors import ConfigError, InputError
from shardstream.shard_builder.importers import ImportConfig, build_import
from tests.builder.conftest import read_with_ours

SMALL = {"shard_size": 4 * 1024, "allow_small_shards": True, "progress": False}
ROWS, PADDED, VOCAB = 96, 160, 1000


def _doc(i: int) -> tuple[list[int], list[int]]:
    """Row ``i``'s document: its ids, and its loss mask (0 on a prompt of ``i % 5``)."""
    n = 1 + i * 37 % 150
    ids = [(i * 7 + j * 13) % VOCAB for j in range(n)]
    prompt = min(i % 5, n - 1)
    return ids, [0] * prompt + [1] * (n - prompt)


def _padded(i: int) -> dict[str, Any]:
    """Row ``i`` as a padded SFT row: right padding on even rows, left on odd ones, labels
    -100 on the prompt and the padding."""
    ids, mask = _doc(i)
    pad = PADDED - len(ids)
    labels = [t if m else -100 for t, m in zip(ids, mask, strict=True)]
    if i % 2:
        return {"input_ids": [0] * pad + ids, "labels": [-100] * pad + labels,
                "attention_mask": [0] * pad + [1] * len(ids), "text": f"row {i}"}  # fmt: skip
    return {"input_ids": ids + [0] * pad, "labels": labels + [-100] * pad,
            "attention_mask": [1] * len(ids) + [0] * pad, "text": f"row {i}"}  # fmt: skip


def _dataset(rows: list[dict[str, Any]], features: datasets.Features) -> datasets.Dataset:
    return datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in rows[0]}, features)


SFT = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.Value("int64")),
        "attention_mask": datasets.Sequence(datasets.Value("int8")),
        "text": datasets.Value("string"),
    }
)


def _packed_documents(out: Path, cache: Path, seq_len: int) -> list[tuple[tuple[int, ...], ...]]:
    """Every document the read-time packer places, as (tokens, mask) read segment by
    segment off ``cu_seqlens``, after checking each segment is one whole document."""
    from shardstream.client import CacheOptions, PackOptions, PlanOptions, StreamingDataset

    ds = StreamingDataset(
        str(out), batch_size=8, pack=PackOptions(seq_len=seq_len),
        plan=PlanOptions(shuffle=True, seed=3), cache=CacheOptions(dir=cache),
    )  # fmt: skip
    found = []
    for batch in ds:
        ids, pos, docs = (np.asarray(batch[k]).reshape(-1) for k in
                          ("input_ids", "position_ids", "doc_ids"))  # fmt: skip
        mask = np.asarray(batch["loss_mask"]).reshape(-1) if "loss_mask" in batch else None
        cu = np.asarray(batch["cu_seqlens"]).tolist()
        seen = set()
        for a, b in itertools.pairwise(cu):
            doc = int(docs[a])
            assert (docs[a:b] == doc).all()
            if doc < 0:
                continue  # padding
            assert (pos[a:b] == np.arange(b - a)).all()  # restarting at the document
            assert doc not in seen  # a document shorter than seq_len is one segment
            seen.add(doc)
            found.append((tuple(ids[a:b].tolist()), tuple([] if mask is None else mask[a:b])))
    return found


def test_padded_sft_rows_import_as_documents_that_pack_with_their_boundaries(
    tmp_path: Path,
) -> None:
    data = _dataset([_padded(i) for i in range(ROWS)], SFT)
    data.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    config = ImportConfig(
        format="hf", inputs=(str(tmp_path / "hf"),), documents=True, vocab_size=VOCAB,
        workers=2, part_bytes=20_000, output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    result = build_import(config)
    # The layout `build text --documents` writes: ids of the vocab's width, the loss mask.
    assert result.columns == {"tokens": "ndarray:uint16", "loss_mask": "ndarray:uint8"}
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert meta["layout"] == "documents" and meta["vocab_size"] == VOCAB
    assert (
        "documents: tokens (uint16) from input_ids; loss_mask from labels (0 where -100); "
        "padding (attention_mask 0) left out; columns left out: text"
    ) in result.summary()
    ours = read_with_ours(tmp_path / "out")
    assert len(ours) == ROWS
    for i, sample in enumerate(ours):
        ids, mask = _doc(i)
        assert sample["tokens"].dtype == np.uint16 and sample["tokens"].tolist() == ids
        assert sample["loss_mask"].tolist() == mask
    # Packed at read time: every document once, whole, with its mask, one segment each.
    want = sorted((tuple(ids), tuple(mask)) for ids, mask in map(_doc, range(ROWS)))
    assert sorted(_packed_documents(tmp_path / "out", tmp_path / "cache", 256)) == want
    # Read in one piece by one worker: the same bytes.
    whole = replace_config(config, workers=1, part_bytes=1 << 30, output=str(tmp_path / "one"))
    build_import(whole)
    assert [s["tokens"].tolist() for s in read_with_ours(tmp_path / "one")] == [
        s["tokens"].tolist() for s in ours
    ]


def replace_config(config: ImportConfig, **changes: Any) -> ImportConfig:
    from dataclasses import replace

    return replace(config, **changes)


def test_plain_input_ids_in_parquet_are_uint32_documents_without_a_mask(tmp_path: Path) -> None:
    docs = [_doc(i)[0] for i in range(40)]
    docs[5] = [70_000, 1, 2]  # past uint16: stored as uint32 without a vocab size
    data = datasets.Dataset.from_dict({"input_ids": docs})
    data.to_parquet(str(tmp_path / "ids.parquet"))
    result = build_import(ImportConfig(
        format="hf", inputs=(str(tmp_path / "ids.parquet"),), documents=True,
        output=str(tmp_path / "out"), **SMALL,
    ))  # fmt: skip
    assert result.columns == {"tokens": "ndarray:uint32"}
    assert [s["tokens"].tolist() for s in read_with_ours(tmp_path / "out")] == docs
    packed = _packed_documents(tmp_path / "out", tmp_path / "cache", 256)
    assert sorted(tokens for tokens, _ in packed) == sorted(map(tuple, docs))


def _parquet(tmp_path: Path, columns: dict[str, Any], types: dict[str, Any] | None = None) -> str:
    """``columns`` as a Parquet file of row groups of 2 rows (errors past the first batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = types or {}
    table = pa.table({k: pa.array(v, types.get(k)) for k, v in columns.items()})
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path, row_group_size=2)
    return str(path)


def _ids(*extra: list[int]) -> list[list[int]]:
    return [[1, 2, 3], [4, 5], [6, 7, 8], *extra]


@pytest.mark.parametrize(
    ("columns", "vocab", "error"),
    [
        ({"text": ["a", "b"]}, None, r"bad\.parquet: no column 'input_ids' \(its columns: text\)"),
        ({"input_ids": [1, 2]}, None, r"row 0: column 'input_ids' is int64, not a list of ids"),
        ({"input_ids": [[0.5], [1.0]]}, None, r"'input_ids' is list<.*double>, not a list of int"),
        ({"input_ids": [[[1, 2], [3]], [[4]]]}, None, r"row 0: column 'input_ids' holds nested"),
        ({"input_ids": _ids([9, 150])}, 100, r"row 3: input_ids\[1\] is 150, outside the voc"),
        ({"input_ids": _ids([9, -1])}, None, r"row 3: input_ids\[1\] is -1, not a uint32 token"),
        ({"input_ids": [*_ids(), None]}, None, r"row 3: column 'input_ids' is null"),
        ({"input_ids": _ids([1, None])}, None, r"row 3: column 'input_ids' has a null at posi"),
        (
            {"input_ids": _ids([1, 2]), "labels": [*_ids(), [1]]}, None,
            r"row 3: labels has 1 values and input_ids 2; give one per token",
        ),
        (
            {"input_ids": _ids([1, 2]), "labels": [*_ids(), [2, -100]]}, None,
            r"row 3: labels\[0\] is 2 where input_ids\[0\] is 1; .*shifted",
        ),
        (
            {"input_ids": _ids([1, 2]), "loss_mask": [[1] * 3, [0, 1], [1] * 3, [1, 2]]}, 10,
            r"row 3: loss_mask\[1\] is 2, not 0 or 1",
        ),
        (
            {"input_ids": _ids([1, 2, 3]),
             "attention_mask": [[1] * 3, [1] * 2, [1] * 3, [1, 0, 1]]},
            None, r"row 3: attention_mask has 2 runs of 1s",
        ),
    ],
)  # fmt: skip
def test_bad_rows_are_one_error_naming_the_file_row_and_column(
    tmp_path: Path, columns: dict[str, Any], vocab: int | None, error: str
) -> None:
    config = ImportConfig(
        format="hf", inputs=(_parquet(tmp_path, columns),), documents=True, vocab_size=vocab,
        output=str(tmp_path / "out"), **SMALL,
    )  # fmt: skip
    with pytest.raises(InputError, match=error):
        build_import(config)
    assert not (tmp_path / "out" / "index.json").exists()


def test_an_empty_document_is_reported_or_skipped(tmp_path: Path) -> None:
    path = _parquet(tmp_path, {"input_ids": _ids([1, 2]), "attention_mask": [
        [1] * 3, [0, 0], [1] * 3, [1, 1]]})  # fmt: skip
    config = ImportConfig(format="hf", inputs=(path,), documents=True,
                          output=str(tmp_path / "out"), **SMALL)  # fmt: skip
    with pytest.raises(InputError, match=r"bad\.parquet row 1: column 'tokens' .*0 elements"):
        build_import(config)
    result = build_import(replace_config(config, skip_bad=True))
    assert [s["tokens"].tolist() for s in read_with_ours(tmp_path / "out")] == [
        [1, 2, 3], [6, 7, 8], [1, 2]
    ]  # fmt: skip
    assert result.metadata["skipped"][0]["source"].endswith("bad.parquet row 1")


def test_documents_and_vocab_size_apply_where_they_mean_something(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="documents applies to litdata"):
        ImportConfig(format="webdataset", inputs=("x",), documents=True, output="o")
    with pytest.raises(ConfigError, match="vocab-size applies to hf and litdata --documents"):
        ImportConfig(format="hf", inputs=("x",), vocab_size=100, output="o")
    with pytest.raises(ConfigError, match="vocab-size applies to hf and litdata --documents"):
        ImportConfig(format="hf", inputs=("x",), documents=True, vocab_size=0, output="o")


def test_sliced_large_and_fixed_size_lists_convert_from_their_offsets() -> None:
    """A record batch's columns may be slices (their values past an offset), large lists or
    fixed-size lists, masks may be bools: each row still gives its own values."""
    import pyarrow as pa

    from shardstream.shard_builder.importers.hf_documents import HfOption, document_batch

    ids = pa.array([[9], [1, 2, 3], [4, 5], [6, 7, 8, 9]], pa.large_list(pa.int64())).slice(1)
    mask = pa.array([[True], [False, True, True], [True, True], [False] * 4]).slice(1)
    attend = pa.array([[1, 1], [1, 1, 1], [0, 1], [0, 1, 1, 0]], pa.list_(pa.uint8())).slice(1)
    batch = pa.RecordBatch.from_arrays([ids, mask, attend], ["input_ids", "loss_mask",
                                                             "attention_mask"])  # fmt: skip
    out = document_batch("f.arrow", 10, batch, HfOption(documents=True, vocab_size=10))
    assert out.columns is not None and out.where(2) == "f.arrow row 12"
    encoding, docs = out.columns["tokens"]
    assert encoding == "ndarray:uint16" and [d.tolist() for d in docs] == [[1, 2, 3], [5], [7, 8]]
    assert [m.tolist() for m in out.columns["loss_mask"][1]] == [[0, 1, 1], [1], [0, 0]]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(range(12), pa.int16()), 3).slice(2)
    out = document_batch("f.arrow", 0, pa.RecordBatch.from_arrays([fixed], ["input_ids"]),
                         HfOption(documents=True))  # fmt: skip
    assert out.columns is not None and list(out.columns) == ["tokens"]
    assert [d.tolist() for d in out.columns["tokens"][1]] == [[6, 7, 8], [9, 10, 11]]


def test_the_option_string_round_trips() -> None:
    from shardstream.shard_builder.importers.hf_documents import HfOption

    for option in (HfOption(), HfOption("test"), HfOption("train", True),
                   HfOption("", True, 50_257), HfOption("a.b", True, 1 << 20)):  # fmt: skip
        assert HfOption.parse(option.encode()) == option


def test_padding_ids_and_labels_are_not_checked(tmp_path: Path) -> None:
    """Ids and labels under attention_mask 0 are left out, whatever they hold."""
    path = _parquet(tmp_path, {
        "input_ids": [[5, 6, -1, -1], [-1, 7, 8, 9]],
        "labels": [[-100, 6, 3, 3], [0, 7, 8, -100]],
        "attention_mask": [[1, 1, 0, 0], [0, 1, 1, 1]],
    })  # fmt: skip
    build_import(ImportConfig(format="hf", inputs=(path,), documents=True, vocab_size=10,
                              output=str(tmp_path / "out"), **SMALL))  # fmt: skip
    got = [
        (s["tokens"].tolist(), s["loss_mask"].tolist()) for s in read_with_ours(tmp_path / "out")
    ]
    assert got == [([5, 6], [0, 1]), ([7, 8, 9], [1, 1, 0])]
