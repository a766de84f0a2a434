"""Text builds: JSONL and Parquet, real tokenizers, read back by our reader and MosaicML's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardstream.mds import load_index
from shardstream.shard_builder import TextBuildConfig, build_text
from tests.builder.conftest import (
    dir_bytes,
    encode_reference,
    make_docs,
    read_with_ours,
    read_with_streaming,
    write_jsonl,
    write_parquet,
)

SEQ = 32


def _config(tmp_path: Path, inputs: tuple[str, ...], **kw: object) -> TextBuildConfig:
    opts: dict[str, object] = {
        "output": str(tmp_path / "out"),
        "inputs": inputs,
        "seq_len": SEQ,
        "shard_size": 4096,
        "allow_small_shards": True,
        "workers": 1,
        "progress": False,
    }
    opts.update(kw)
    return TextBuildConfig(**opts)  # type: ignore[arg-type]


def _check_stream(samples: list[np.ndarray], expected: np.ndarray, dropped: int) -> None:
    got = np.concatenate(samples).astype(np.int64)
    assert len(got) % SEQ == 0
    assert len(got) + dropped == len(expected)
    assert dropped < SEQ
    np.testing.assert_array_equal(got, expected[: len(got)])


def test_jsonl_with_tokenizer_reads_back_in_both_readers(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    docs = make_docs(400)
    write_jsonl(tmp_path / "b.jsonl", docs[200:])
    write_jsonl(tmp_path / "a.jsonl", docs[:200])  # sorted order, not creation order
    result = build_text(_config(tmp_path, (str(tmp_path / "*.jsonl"),), tokenizer=tokenizer_file))

    expected = encode_reference(tokenizer_file, docs)
    out = tmp_path / "out"
    assert result.columns == {"tokens": f"ndarray:uint16:{SEQ}"}
    assert result.documents == 400
    assert result.tokens == len(expected)
    ours = [s["tokens"] for s in read_with_ours(out)]
    _check_stream(ours, expected, result.dropped_tokens)  # type: ignore[arg-type]
    theirs = [s["tokens"] for s in read_with_streaming(out, tmp_path / "cache")]
    _check_stream(theirs, expected, result.dropped_tokens)  # type: ignore[arg-type]
    assert result.samples == len(ours) > 0

    # Shards are the requested size within 10%, except the last.
    sizes = [s.raw_data.bytes for s in result.shards]
    assert len(sizes) > 3
    assert all(3686 <= size <= 4096 for size in sizes[:-1]), sizes
    meta = json.loads((out / "shardstream.json").read_text())
    assert meta["tokenizer"]["eos_id"] == 0 and meta["dropped_tokens"] == result.dropped_tokens
    assert [f["path"] for f in meta["lineage"]] == [
        str((tmp_path / n).resolve()) for n in ("a.jsonl", "b.jsonl")
    ]
    assert not (out / ".shardstream-build").exists()


def test_parquet_row_groups_match_the_same_docs_as_jsonl(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    docs = make_docs(300, seed=3)
    write_parquet(tmp_path / "docs.parquet", docs, row_group_size=40)
    write_jsonl(tmp_path / "docs.jsonl", docs)
    from_pq = build_text(
        _config(tmp_path, (str(tmp_path / "docs.parquet"),), tokenizer=tokenizer_file)
    )
    from_json = build_text(
        _config(
            tmp_path,
            (str(tmp_path / "docs.jsonl"),),
            tokenizer=tokenizer_file,
            output=str(tmp_path / "out2"),
        )
    )
    expected = encode_reference(tokenizer_file, docs)
    samples = [s["tokens"] for s in read_with_streaming(tmp_path / "out", tmp_path / "c")]
    _check_stream(samples, expected, from_pq.dropped_tokens)  # type: ignore[arg-type]
    # The same documents give the same shards, whatever the input format.
    shard_names = [s.raw_data.basename for s in from_pq.shards]
    for name in shard_names:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
    assert from_json.index.to_json() == from_pq.index.to_json()


def test_byte_fallback_and_zstd(tmp_path: Path) -> None:
    docs = make_docs(150, seed=5)
    write_jsonl(tmp_path / "d.jsonl", docs, field="body")
    result = build_text(
        _config(tmp_path, (str(tmp_path),), field="body", compression="zstd", seq_len=SEQ)
    )
    assert result.columns == {"tokens": f"ndarray:uint16:{SEQ}"}
    assert all(s.zip_data is not None for s in result.shards)
    samples = [s["tokens"] for s in read_with_ours(tmp_path / "out")]
    _check_stream(samples, encode_reference(None, docs), result.dropped_tokens)  # type: ignore[arg-type]
    assert result.metadata["tokenizer"] == {"kind": "bytes", "vocab_size": 257, "eos_id": 256}


def test_big_vocabulary_uses_uint32(tmp_path: Path, big_vocab_tokenizer_file: Path) -> None:
    docs = make_docs(100, seed=8)
    write_jsonl(tmp_path / "d.jsonl", docs)
    result = build_text(
        _config(tmp_path, (str(tmp_path / "d.jsonl"),), tokenizer=big_vocab_tokenizer_file)
    )
    assert result.columns == {"tokens": f"ndarray:uint32:{SEQ}"}
    samples = [s["tokens"] for s in read_with_ours(tmp_path / "out")]
    assert samples[0].dtype == np.uint32  # type: ignore[union-attr]
    expected = encode_reference(big_vocab_tokenizer_file, docs)
    assert expected.max() >= 1 << 16
    _check_stream(samples, expected, result.dropped_tokens)  # type: ignore[arg-type]


@pytest.mark.slow
def test_worker_count_does_not_change_a_byte(tmp_path: Path, tokenizer_file: Path) -> None:
    docs = make_docs(1500, seed=11)
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "x.jsonl", docs[:700])
    write_jsonl(tmp_path / "in" / "y.jsonl", docs[700:])
    write_parquet(tmp_path / "in" / "z.parquet", docs[:300], row_group_size=64)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        result = build_text(
            _config(
                tmp_path,
                (str(tmp_path / "in"),),
                tokenizer=tokenizer_file,
                output=str(out),
                workers=workers,
                chunk_bytes=2000,  # many chunks, so the two workers really interleave
            )
        )
        assert result.documents == 1800
        outs.append(dir_bytes(out))
    assert outs[0] == outs[1]
    assert len(outs[0]) > 10


def test_rerun_of_a_finished_build_is_a_no_op(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", make_docs(100))
    config = _config(tmp_path, (str(tmp_path / "d.jsonl"),))
    first = build_text(config)
    before = dir_bytes(tmp_path / "out")
    again = build_text(config)
    assert again.reused_shards == len(first.shards)
    assert again.index.to_json() == first.index.to_json()
    assert dir_bytes(tmp_path / "out") == before
    index = load_index(tmp_path / "out" / "index.json")
    assert index.num_samples == first.samples
