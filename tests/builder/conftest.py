"""Fixtures for the shard builder: generated documents, tiny tokenizers, images.

Tokenizers are trained here with HF ``tokenizers`` on the generated corpus (no hub
downloads); images are drawn with Pillow.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from shardstream.mds import ShardReader, decompress_shard, load_index

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "it",
    "an",
    "are",
    "were",
    "which",
    "this",
    "be",
    "or",
    "had",
    "not",
    "but",
    "have",
    "one",
    "all",
    "they",
    "their",
    "more",
    "been",
    "its",
    "who",
    "so",
    "we",
    "no",
    "can",
    "time",
    "shard",
    "stream",
    "token",
    "epoch",
    "batch",
    "resume",
    "worker",
    "node",
    "cache",
    "index",
    "bucket",
    "sample",
    "sequence",
]


def make_docs(n: int, seed: int = 0, *, max_words: int = 60) -> list[str]:
    """``n`` deterministic pseudo-English documents, some with non-ASCII text."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, max_words))]
        if i % 7 == 0:
            words.append("naïve café — 東京")
        docs.append(" ".join(words))
    return docs


def write_jsonl(path: Path, docs: Sequence[str], field: str = "text") -> Path:
    """One JSON object per line with ``field`` holding the document (and an id)."""
    with open(path, "w", encoding="utf-8") as fh:
        for i, doc in enumerate(docs):
            fh.write(json.dumps({"id": i, field: doc}, ensure_ascii=False) + "\n")
    return path


def write_lmdb(root: Path, records: int, *, base: int, spread: int) -> str:
    """An LMDB database ``root/db`` of ``records`` keys ``k00000, ...``; value ``i`` is
    ``base + i % spread`` copies of byte ``i % 256``. Returns its path."""
    import lmdb

    env = lmdb.open(str(root / "db"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(records):
            txn.put(f"k{i:05d}".encode(), bytes([i % 256]) * (base + i % spread))
    env.close()
    return str(root / "db")


def write_parquet(path: Path, docs: Sequence[str], *, row_group_size: int = 50) -> Path:
    """A Parquet file with a ``text`` column in several row groups."""
    table = pa.table({"id": list(range(len(docs))), "text": list(docs)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer (vocab ~400) trained on the generated corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_docs(300, seed=99), trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def big_vocab_tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer whose vocabulary (70,000) does not fit uint16."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"filler{i}": i for i in range(70_000 - len(WORDS) - 2)}
    for word in [*WORDS, "[UNK]", "</s>"]:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("bigtok") / "tokenizer.json"
    tok.save(str(path))
    return path


def encode_reference(tokenizer_path: Path | None, docs: Sequence[str]) -> np.ndarray:
    """The expected token stream, computed independently of the builder: each doc + EOS."""
    if tokenizer_path is None:
        parts = [[*list(doc.encode("utf-8")), 256] for doc in docs]
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_path))
        eos = tok.token_to_id("<|endoftext|>")
        if eos is None:
            eos = tok.token_to_id("</s>")
        parts = [[*tok.encode(doc, add_special_tokens=False).ids, eos] for doc in docs]
    return np.array([t for part in parts for t in part], dtype=np.int64)


def read_with_ours(out: Path) -> list[dict[str, object]]:
    """Every sample of a local MDS dataset, read with shardstream's own reader."""
    index = load_index(out / "index.json")
    samples: list[dict[str, object]] = []
    for shard in index.shards:
        path = out / shard.raw_data.basename
        if shard.zip_data is not None:
            decompress_shard(out / shard.zip_data.basename, path, shard.compression or "")
        reader = ShardReader(path, shard)
        samples.extend(reader[i] for i in range(len(reader)))
    return samples


def read_with_streaming(out: Path, cache: Path) -> list[dict[str, object]]:
    """Every sample, read with the real ``streaming.StreamingDataset`` (no shuffle)."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    return [ds[i] for i in range(len(ds))]


def dir_bytes(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` by relative path (to compare two outputs byte for byte)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def jpeg_bytes(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    """A small noisy JPEG (noise keeps its size realistic)."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def png_bytes(seed: int, size: tuple[int, int] = (24, 24)) -> bytes:
    """A small PNG."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 255, (size[1], size[0], 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, mode="RGBA").save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """``root/<class>/*.jpg``: 3 classes, 12 JPEGs each, named so sorting matters."""
    root = tmp_path / "images"
    for label, name in enumerate(["cat", "dog", "zebra"]):
        (root / name).mkdir(parents=True)
        for i in range(12):
            (root / name / f"img{i:03d}.jpg").write_bytes(jpeg_bytes(100 * label + i))
    return root


MakeFolder = Callable[[Path], Path]
