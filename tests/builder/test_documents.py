"""``build text --documents``: one variable-length token array per document (and loss masks)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shardstream.errors import ConfigError, InputError
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
from tests.fixtures.build_runs import build_cli, kill_when_journaled


def _config(tmp_path: Path, inputs: list[Path], out: str = "out", **kw: object) -> TextBuildConfig:
    options: dict[str, object] = {
        "shard_size": 4096,
        "allow_small_shards": True,
        "workers": 2,
        "progress": False,
        "chunk_bytes": 3000,
        "documents": True,
    }
    options.update(kw)
    return TextBuildConfig(
        output=str(tmp_path / out),
        inputs=tuple(str(p) for p in inputs),
        **options,  # type: ignore[arg-type]
    )


def test_each_document_is_one_sample_with_its_eos(tmp_path: Path, tokenizer_file: Path) -> None:
    docs = make_docs(400, seed=3)
    write_jsonl(tmp_path / "a.jsonl", docs[:250])
    write_parquet(tmp_path / "b.parquet", docs[250:])
    result = build_text(
        _config(tmp_path, [tmp_path / "a.jsonl", tmp_path / "b.parquet"], tokenizer=tokenizer_file)
    )
    assert result.columns == {"tokens": "ndarray:uint16"}
    assert result.samples == result.documents == 400
    assert len(result.shards) > 3  # cut by size
    samples = read_with_ours(tmp_path / "out")
    for doc, sample in zip(docs, samples, strict=True):
        expected = encode_reference(tokenizer_file, [doc])
        assert np.asarray(sample["tokens"]).tolist() == expected.tolist()
    assert result.tokens == sum(len(np.asarray(s["tokens"])) for s in samples)
    meta = json.loads((tmp_path / "out" / "shardstream.json").read_text())
    assert meta["layout"] == "documents" and "seq_len" not in meta


def test_mosaicml_streaming_reads_document_shards(tmp_path: Path) -> None:
    docs = make_docs(60, seed=4)
    write_jsonl(tmp_path / "a.jsonl", docs)
    build_text(_config(tmp_path, [tmp_path / "a.jsonl"]))
    theirs = read_with_streaming(tmp_path / "out", tmp_path / "cache")
    for doc, sample in zip(docs, theirs, strict=True):
        assert np.asarray(sample["tokens"]).tolist() == [*doc.encode(), 256]


def test_prompt_response_pairs_get_a_loss_mask(tmp_path: Path) -> None:
    pairs = [{"prompt": f"Q{i}: {'?' * (i % 4)}", "response": "A" * (1 + i % 6)} for i in range(90)]
    with open(tmp_path / "chat.jsonl", "w") as fh:
        for pair in pairs:
            fh.write(json.dumps(pair) + "\n")
    result = build_text(
        _config(tmp_path, [tmp_path / "chat.jsonl"], prompt_field="prompt", field="response")
    )
    assert result.columns == {"tokens": "ndarray:uint16", "loss_mask": "ndarray:uint8"}
    for pair, sample in zip(pairs, read_with_ours(tmp_path / "out"), strict=True):
        prompt, reply = list(pair["prompt"].encode()), [*pair["response"].encode(), 256]
        assert np.asarray(sample["tokens"]).tolist() == prompt + reply
        assert np.asarray(sample["loss_mask"]).tolist() == [0] * len(prompt) + [1] * len(reply)


def test_document_options_are_checked(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match="prompt-field needs --documents"):
        _config(tmp_path, [tmp_path / "a.jsonl"], documents=False, prompt_field="q")
    with pytest.raises(ConfigError, match="another field"):
        _config(tmp_path, [tmp_path / "a.jsonl"], prompt_field="text")
    with pytest.raises(InputError, match=r"a.jsonl:1: no field 'prompt'"):
        build_text(_config(tmp_path, [tmp_path / "a.jsonl"], prompt_field="prompt"))


def test_token_build_fingerprint_is_unchanged_by_the_document_options(tmp_path: Path) -> None:
    from shardstream.shard_builder.config import content_options

    config = _config(tmp_path, [tmp_path / "a.jsonl"], documents=False)
    assert "documents" not in content_options(config)
    assert "prompt_field" not in content_options(config)


def test_cli_documents_flag(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", make_docs(30, seed=5))
    args = build_cli(
        "text", str(tmp_path / "a.jsonl"), "--documents", "--output", str(tmp_path / "out"),
        "--shard-size", "4KB", "--allow-small-shards", "--workers", "1",
    )  # fmt: skip
    done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(read_with_ours(tmp_path / "out")) == 30


@pytest.mark.slow
def test_document_build_killed_and_rerun_matches_a_clean_build(tmp_path: Path) -> None:
    docs = make_docs(6000, seed=22, max_words=80)
    write_jsonl(tmp_path / "a.jsonl", docs)
    out = tmp_path / "out"
    args = build_cli(
        "text", str(tmp_path / "a.jsonl"), "--documents", "--output", str(out),
        "--shard-size", "8KB", "--allow-small-shards", "--chunk-bytes", "40KB",
        "--workers", "2",
    )  # fmt: skip
    proc = subprocess.Popen(args, start_new_session=True, stderr=subprocess.PIPE)
    killed_after = kill_when_journaled(proc, out / ".shardstream-build" / "done", shards=10)
    rerun = subprocess.run(args, check=False, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "reused" in rerun.stderr
    reference = build_text(
        _config(tmp_path, [tmp_path / "a.jsonl"], out="ref", shard_size=8192, chunk_bytes=4096)
    )
    assert len(reference.shards) > killed_after + 5
    assert dir_bytes(out) == dir_bytes(tmp_path / "ref")
