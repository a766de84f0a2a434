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
(:mod:`.pipeline`); this module supplies the text kind's source and encoder
(:class:`TextKind`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.errors import InputError
from shardstream.mds import samples_per_shard
from shardstream.shard_builder.config import TextBuildConfig, content_options
from shardstream.shard_builder.inputs import lineage, resolve_inputs
from shardstream.shard_builder.journal import fingerprint
from shardstream.shard_builder.packing import StreamPosition, TokenPacker
from shardstream.shard_builder.pipeline import BuildKind, BuildRun, run_build
from shardstream.shard_builder.result import BuildResult
from shardstream.shard_builder.skipped_lines import SkippedLines
from shardstream.shard_builder.text_source import BadRecords, TextChunk, plan_chunks, read_docs
from shardstream.shard_builder.tokenize import TokenizerSpec, token_dtype

TEXT_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")
BUILDER_VERSION = 1  # bump when the same inputs would give other bytes


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a chunk to read and tokenize into ``dtype`` ids."""

    chunk: TextChunk
    field: str
    tokenizer: TokenizerSpec
    dtype: str
    skip_bad: bool = False


@dataclass(frozen=True)
class ChunkTokens:
    """A chunk's token stream (every document + EOS), its document count and, with
    ``skip_bad``, the bad records it left out."""

    tokens: npt.NDArray[Any]
    documents: int
    bad: BadRecords | None = None


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


@dataclass(frozen=True)
class TextSource:
    """What a text build reads: its chunks in order (each with ``nbytes``), the lineage
    recorded in the fingerprint and metadata, and the input names errors show."""

    chunks: Sequence[Any]
    lineage: list[dict[str, Any]]
    names: list[str]


def file_source(config: TextBuildConfig) -> TextSource:
    """The chunks of ``config.inputs``: JSONL byte ranges and Parquet row groups."""
    files = resolve_inputs(config.inputs, TEXT_SUFFIXES)
    chunks = plan_chunks(files, config.field, config.chunk_bytes)
    return TextSource(chunks, lineage(files), [str(f.path) for f in files])


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


def text_kind(config: TextBuildConfig, source: TextSource | None = None) -> TextKind:
    """The kind of a text build: fixed-length sequences, or documents (``--documents``).
    ``source`` is what is read (default: :func:`file_source`)."""
    if config.documents:
        from shardstream.shard_builder.documents import DocumentKind

        return DocumentKind(config, source)
    return TextKind(config, source)


class TextKind(BuildKind):
    """A text build for :func:`~.pipeline.run_build`: its source is the chunks of the
    inputs, its encoder tokenizes them and cuts fixed-length sequences
    (:class:`~.packing.TokenPacker`), ``samples_per_shard`` a shard.

    Journal records count in chunks (so a resume must cut the input the same way): the
    stream position after the shard, and the documents before that position's chunk. The
    counters ``tokens``, ``documents`` and ``dropped`` end in ``shardstream.json``; the Ray
    driver (:mod:`.cluster.text`) keeps them too.
    """

    desc = "build text"
    config: TextBuildConfig

    def __init__(self, config: TextBuildConfig, source: TextSource | None = None) -> None:
        super().__init__(config)
        self.source = source or file_source(config)
        self.spec = TokenizerSpec(config.tokenizer, config.eos_token)
        tokenizer = self.spec.load()
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.eos_id, self.vocab_size = tokenizer.eos_id, tokenizer.vocab_size
        self.described = tokenizer.describe()
        self.columns = self.make_columns()
        self._fingerprint = fingerprint(
            {
                "builder": BUILDER_VERSION,
                "options": content_options(config),
                "lineage": self.source.lineage,
                "tokenizer": {k: v for k, v in self.described.items() if k != "path"},
            }
        )
        self.position = StreamPosition(0, 0, 0)  # where this run starts
        self.tokens = self.documents = self.dropped = 0
        self.skipped = SkippedLines()  # --skip-bad: the bad records left out

    def make_columns(self) -> dict[str, str]:
        """The shards' columns."""
        return {self.config.column: f"ndarray:{self.dtype.name}:{self.config.seq_len}"}

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def journal_fingerprint(self) -> str:
        return fingerprint({"content": self._fingerprint, "chunks": self.config.chunk_bytes})

    @property
    def units(self) -> Sequence[Any]:
        return self.source.chunks

    @property
    def samples_per_shard(self) -> int:
        """Sequences a shard holds."""
        config = self.config
        return samples_per_shard(
            self.columns, config.shard_size, compression=config.compression, hashes=config.hashes
        )

    def start(self, run: BuildRun) -> int:
        resume = run.resume
        self.position = StreamPosition.from_dict(resume["stream"]) if resume else self.position
        self.documents = int(resume.get("documents_before_chunk", 0))
        self.skipped.restore(resume.get("skipped_before_chunk"))
        self.tokens = self.position.tokens_before
        if run.final:
            self.documents, self.dropped = resume["docs"], resume["dropped"]
            self.skipped.restore(resume.get("skipped"))
        self.open_encoder()
        return self.position.chunk

    def open_encoder(self) -> None:
        """Start cutting at :attr:`position` (a local build)."""
        config = self.config
        self._packer = TokenPacker(
            config.seq_len, self.samples_per_shard, self.dtype, self.position
        )
        self._reported = 0

    # Typed as the pipeline's (Any): a document build swaps this encoder for its own.
    def task(self, number: int, unit: Any) -> Any:
        return ChunkTask(unit, self.config.field, self.spec, self.dtype.name, self.config.skip_bad)

    @staticmethod
    def work(task: Any) -> Any:
        """A worker's step: :func:`tokenize_chunk`."""
        return tokenize_chunk(task)

    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        column = self.config.column
        for block, pos in self._packer.add(number, result.tokens):
            resume = {"stream": pos.to_dict(), "documents_before_chunk": self.documents}
            if self.config.skip_bad:
                resume["skipped_before_chunk"] = self.skipped.state()
            run.store_arrays(resume, self.columns, {column: block})
        self.documents += result.documents
        self.skipped.take(self.units[number], result.bad)
        # Whole sequences so far: the rate users care about, before a shard ends.
        seq_len = self.config.seq_len
        sequences = (self._packer.tokens_seen - self.position.tokens_before) // seq_len
        new, self._reported = sequences - self._reported, sequences
        return new, new * seq_len * self.dtype.itemsize

    def finish(self, run: BuildRun) -> None:
        last, self.dropped = self._packer.finish()
        self.tokens = self._packer.tokens_seen
        if len(last):
            run.store_arrays(self.final_resume(), self.columns, {self.config.column: last})

    def final_resume(self) -> dict[str, Any]:
        """The journal record of the last shard: the end of the stream and the final counts."""
        end = StreamPosition(len(self.units), 0, self.tokens)
        final = {
            "stream": end.to_dict(),
            "final": True,
            "dropped": self.dropped,
            "docs": self.documents,
        }
        if self.config.skip_bad:
            final["skipped"] = self.skipped.state()
        return final

    def empty_error(self) -> InputError:
        error = too_little_input(self.config, self.source.names, self.documents, self.tokens)
        if self.skipped.count:
            return InputError(f"{error} ({self.skipped.count} bad lines skipped)")
        return error

    def metadata(self, run: BuildRun) -> dict[str, Any]:
        layout = (
            {"layout": "documents"} if self.config.documents else {"seq_len": self.config.seq_len}
        )
        return {
            "kind": "text",
            "fingerprint": self._fingerprint,
            "columns": self.columns,
            **layout,
            "tokenizer": self.described,
            "eos_id": self.eos_id,
            "vocab_size": self.vocab_size,
            "tokens": self.tokens,
            "documents": self.documents,
            "dropped_tokens": self.dropped,
            "config": content_options(self.config),
            "lineage": self.source.lineage,
            **self._skipped_metadata(),
        }

    def _skipped_metadata(self) -> dict[str, Any]:
        if not self.config.skip_bad:
            return {}
        named = [{"source": b.source, "reason": b.reason} for b in self.skipped.named]
        return {"skipped": named, "skipped_count": self.skipped.count}


def too_little_input(
    config: TextBuildConfig, inputs: list[str], documents: int, tokens: int
) -> InputError:
    """The error of a build whose input holds no documents, or less than one sequence."""
    names = ", ".join(inputs[:3]) + (" ..." if len(inputs) > 3 else "")
    if documents == 0:
        return InputError(f"no documents in the input ({names}): the files hold no text records")
    return InputError(
        f"the input ({names}) holds {documents} documents = {tokens} tokens, fewer than one "
        f"sequence of --seq-len {config.seq_len}; add data or lower --seq-len"
    )
