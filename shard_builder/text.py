"""``build_text``: documents -> tokenized fixed-length sequences -> MDS shards.

The work split, chosen so the output never depends on scheduling:

1. the inputs are cut into chunks (JSONL byte ranges, Parquet row groups) that depend only
   on the files;
2. worker processes read and tokenize chunks in parallel (HF ``encode_batch``); results
   come back in chunk order;
3. this process cuts the ordered token stream into shard-sized blocks of sequences and
   writes each with the codec's vectorized ``write_shard_arrays`` (no per-sample Python);
4. after every stored shard the journal records where the stream stood, so a killed
   build resumes after its last finished shard without re-reading what came before.

Steps 2 and 4 (and the rest: journal, progress, index) are the builder's one pipeline
(:mod:`.pipeline`); step 3 is the text kind's cut (:class:`TextKind`, from token counts
alone: :class:`~.packing.StreamCutter`), which a Ray build applies too
(:mod:`.cluster.driver`). The source, tokenizer, journal records and metadata are those of
every tokenized build (:mod:`.tokenized`); ``--documents`` is its sibling kind
(:mod:`.documents`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.mds import samples_per_shard
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.cut import Counted, CutShard, ShardLayout
from shardstream.shard_builder.documents import DocumentKind
from shardstream.shard_builder.packing import StreamCutter
from shardstream.shard_builder.pipeline import run_build
from shardstream.shard_builder.result import BuildResult
from shardstream.shard_builder.text_source import BadRecords, read_docs
from shardstream.shard_builder.tokenize import TokenizerSpec
from shardstream.shard_builder.tokenized import TextSource, TokenizedKind

__all__ = ["ChunkTask", "ChunkTokens", "TextKind", "TokenCount", "build_text", "text_kind"]


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a chunk to read and tokenize into ``dtype`` ids (a
    :class:`~.text_source.TextChunk`; on Ray, a dataset block, read by the step of
    :mod:`.cluster.dataset`)."""

    chunk: Any
    field: str
    tokenizer: TokenizerSpec
    dtype: str
    skip_bad: bool = False


@dataclass(frozen=True)
class TokenCount:
    """What the cut needs of a tokenized chunk (all a Ray driver gets of it): its tokens
    and documents, and with ``skip_bad`` the bad records it left out."""

    tokens: int
    documents: int
    bad: BadRecords | None = None


@dataclass(frozen=True)
class ChunkTokens:
    """A chunk's token stream (every document + EOS), its document count and, with
    ``skip_bad``, the bad records it left out."""

    tokens: npt.NDArray[Any]
    documents: int
    bad: BadRecords | None = None

    @property
    def items(self) -> int:
        """Documents in the chunk."""
        return self.documents

    @property
    def payload(self) -> npt.NDArray[Any]:
        """What shards take pieces of: the tokens."""
        return self.tokens

    def count(self) -> TokenCount:
        """What the cut needs."""
        return TokenCount(len(self.tokens), self.documents, self.bad)


def tokenize_chunk(task: ChunkTask) -> ChunkTokens:
    """Worker: read one chunk's documents and tokenize them (a worker process or Ray actor)."""
    tokenizer = task.tokenizer.load()
    parts: list[npt.NDArray[Any]] = []
    documents = 0
    bad = BadRecords() if task.skip_bad else None
    for docs in read_docs(task.chunk, task.field, bad):
        if docs:
            parts.append(tokenizer.encode_docs(docs).astype(task.dtype, copy=False))
            documents += len(docs)
    tokens = np.concatenate(parts) if parts else np.empty(0, task.dtype)
    return ChunkTokens(tokens, documents, bad)


def build_text(config: TextBuildConfig) -> BuildResult:
    """Tokenize ``config.inputs`` into ``ndarray:<uint16|uint32>:<seq_len>`` shards (with
    ``config.documents``: one variable-length ``ndarray:<dtype>`` per document, see
    :mod:`.documents`).

    Raises :class:`InputError` for malformed input (naming file and line/row) and
    :class:`ConfigError` for bad options or a tokenizer that does not load. Re-running an
    interrupted build with the same config reuses its finished shards.

    Example::

        result = build_text(TextBuildConfig(output="out", inputs=("data/*.jsonl",), seq_len=512))
        print(result.samples, result.dropped_tokens)
    """
    return run_build(text_kind(config))


def text_kind(config: TextBuildConfig, source: TextSource | None = None) -> TokenizedKind:
    """The kind of a text build: fixed-length sequences, or documents (``--documents``).
    ``source`` is what is read (default: :func:`~.tokenized.file_source`)."""
    if config.documents:
        return DocumentKind(config, source)
    return TextKind(config, source)


class TextKind(TokenizedKind):
    """A build of fixed-length sequences: workers tokenize chunks, the cut packs the token
    stream into ``seq_len`` sequences (:class:`~.packing.StreamCutter`), ``samples_per_shard``
    a shard; only the last remainder shorter than a sequence is dropped."""

    def make_columns(self) -> dict[str, str]:
        return {self.config.column: f"ndarray:{self.dtype.name}:{self.config.seq_len}"}

    def shape_metadata(self) -> dict[str, Any]:
        return {"seq_len": self.config.seq_len}

    @property
    def samples_per_shard(self) -> int:
        """Sequences a shard holds."""
        config = self.config
        return samples_per_shard(
            self.columns, config.shard_size, compression=config.compression, hashes=config.hashes
        )

    def open_cut(self) -> None:
        config = self.config
        self.layout = ShardLayout(self.columns, config.seq_len)
        self._cutter = StreamCutter(config.seq_len, self.samples_per_shard, self.position)
        self._reported = 0  # whole sequences so far

    def task(self, number: int, unit: Any) -> ChunkTask:
        return ChunkTask(unit, self.config.field, self.spec, self.dtype.name, self.config.skip_bad)

    work = staticmethod(tokenize_chunk)

    def cut(self, number: int, count: TokenCount) -> Counted:
        cutter = self._cutter
        shards = [
            CutShard(c.pieces, self.resume_at(c.position)) for c in cutter.add(number, count.tokens)
        ]
        self.documents += count.documents
        self.skipped.take(self.units[number], count.bad)
        # Whole sequences so far: the rate users care about, before a shard ends.
        seq_len = self.config.seq_len
        sequences = (cutter.tokens_seen - self.position.tokens_before) // seq_len
        new, self._reported = sequences - self._reported, sequences
        out_bytes = new * seq_len * self.dtype.itemsize
        return Counted(
            shards, new, out_bytes, {"documents": count.documents, "tokens": count.tokens}
        )

    def cut_last(self) -> CutShard | None:
        last, self.dropped = self._cutter.finish()
        self.tokens = self._cutter.tokens_seen
        return None if last is None else CutShard(last.pieces, self.final_resume())

    def needed(self, number: int) -> bool:
        first = self._cutter.first_needed
        return first is not None and number >= first
