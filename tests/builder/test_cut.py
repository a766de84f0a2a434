"""A kind states its shard cut once (``shard_builder.cut``): a local build applies it, and
what a Ray worker does with it (the kind's step, its count and payload, the kind's
``ShardLayout`` written into a ``cluster.worker.WorkerOutput``, run here in this process)
gives the very same shards; text and documents are sibling kinds; a lost Ray worker's
error carries its data as fields. The Ray builds themselves are compared with local ones in
``test_ray.py`` and ``test_ray_documents.py``.
"""

from __future__ import annotations

import ast
import inspect
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from shardstream.shard_builder.cluster.worker import WorkerOutput
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.cut import CutKind
from shardstream.shard_builder.documents import DocumentKind
from shardstream.shard_builder.images import ImageKind
from shardstream.shard_builder.journal import shard_key
from shardstream.shard_builder.pipeline import run_build
from shardstream.shard_builder.text import TextKind, text_kind
from shardstream.shard_builder.tokenized import TokenizedKind
from tests.builder.conftest import dir_bytes, make_docs, write_jsonl


def _config(out: Path, docs: Path, tokenizer: Path, **more: Any) -> TextBuildConfig:
    return TextBuildConfig(
        output=str(out), inputs=(str(docs),), tokenizer=tokenizer, seq_len=32,
        shard_size=4096, allow_small_shards=True, chunk_bytes=8 << 10, workers=1,
        progress=False, **more,
    )  # fmt: skip


def _shards(out: Path) -> dict[str, bytes]:
    return {name: data for name, data in dir_bytes(out).items() if name.endswith(".mds")}


def _cut_on_a_worker(kind: TokenizedKind, out: Path) -> list[dict[str, Any]]:
    """What the Ray driver and its actors do with ``kind``'s cut, without Ray: the kind's
    step on every unit, only the counts through the kind's cut, in order, and each shard it
    closes written from the units' payloads as ``BuildWorker.write`` does. Returns the
    journal records, in order."""
    output = WorkerOutput(str(out))
    try:
        kind.open_cut()  # a fresh build: what ``start`` does without a journal
        payloads: dict[int, Any] = {}
        shards = []
        for number, unit in enumerate(kind.units):
            result = kind.work(kind.task(number, unit))
            payloads[number] = result.payload
            shards.extend(kind.cut(number, result.count()).shards)
        if (last := kind.cut_last()) is not None:
            shards.append(last)
        for position, shard in enumerate(shards):
            data = kind.layout.data(shard.pieces, payloads)
            key = shard_key(position, kind.config.spread_prefixes)
            info = kind.layout.write(output.folder, key, data, kind.config)
            output.store(position, info, shard.resume)
        return [s.resume for s in shards]
    finally:
        output.close()


@pytest.mark.parametrize(
    "options",
    [{}, {"documents": True}, {"documents": True, "prompt_field": "prompt"}],
    ids=["sequences", "documents", "chat"],
)
def test_a_worker_writes_the_shards_a_local_build_writes_from_the_same_cut(
    tmp_path: Path, tokenizer_file: Path, options: dict[str, Any]
) -> None:
    docs = make_docs(400, seed=7, max_words=50)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    if "prompt_field" in options:  # chat pairs: a prompt and a response per record
        pairs = [{"prompt": doc[:20], "text": doc[20:] + "."} for doc in docs]
        path.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    local = run_build(text_kind(_config(tmp_path / "local", path, tokenizer_file, **options)))
    kind = text_kind(_config(tmp_path / "worker", path, tokenizer_file, **options))
    records = _cut_on_a_worker(kind, tmp_path / "worker")
    assert len(records) == len(local.shards) > 2
    assert _shards(tmp_path / "worker") == _shards(tmp_path / "local")
    assert records[-1]["final"] is True and "final" not in records[0]


def test_text_and_documents_are_siblings_of_one_tokenized_kind() -> None:
    assert issubclass(TextKind, TokenizedKind) and issubclass(DocumentKind, TokenizedKind)
    assert not issubclass(DocumentKind, TextKind) and not issubclass(TextKind, DocumentKind)
    assert all(issubclass(k, CutKind) for k in (TextKind, DocumentKind, ImageKind))
    # The document kind needs nothing of the text kind's module (no import circle).
    tree = ast.parse(Path(inspect.getfile(DocumentKind)).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "shardstream.shard_builder.tokenized" in imported
    assert "shardstream.shard_builder.text" not in imported


def test_the_lost_worker_error_carries_its_data_as_fields() -> None:
    import ray.exceptions

    from shardstream.shard_builder.cluster import pool

    class _Ray:  # what translate_errors uses of the ray module: its exception classes
        exceptions = ray.exceptions

    with pytest.raises(pool.WorkerLostError) as caught, pool.translate_errors(_Ray()):
        raise ray.exceptions.NodeDiedError("node 3fa2 died\nmore lines")
    error = caught.value
    assert (error.error, error.detail) == ("NodeDiedError", "node 3fa2 died")
    assert error.lost == (
        "a Ray worker or its node was lost during the build (NodeDiedError: node 3fa2 died)"
    )
    assert (
        str(error)
        == f"{error.lost}; the finished shards are kept: run the same command again to resume"
    )
    again = pickle.loads(pickle.dumps(error))
    assert (again.error, again.detail, str(again)) == (error.error, error.detail, str(error))
