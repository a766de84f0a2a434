"""What every tokenized build shares: its source, tokenizer, fingerprint, journal and metadata.

``build text`` makes two kinds, siblings of one parent (:class:`TokenizedKind`):
fixed-length sequences (:class:`~.text.TextKind`) and whole documents (``--documents``,
:class:`~.documents.DocumentKind`). Both read the same chunks of the inputs (JSONL byte
ranges, Parquet row groups; on Ray, dataset blocks), load the same tokenizer, count their
journal positions in chunks (a :class:`~.packing.StreamPosition`: a resume must cut the
input the same way) and write the same ``shardstream.json``; each states only its columns
and its cut (:class:`~.cut.CutKind`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardstream.errors import InputError
from shardstream.shard_builder.config import TextBuildConfig, content_options
from shardstream.shard_builder.cut import CutKind
from shardstream.shard_builder.inputs import lineage, resolve_inputs
from shardstream.shard_builder.journal import fingerprint
from shardstream.shard_builder.packing import StreamPosition
from shardstream.shard_builder.pipeline import BuildRun
from shardstream.shard_builder.skipped_lines import SkippedLines
from shardstream.shard_builder.text_source import plan_chunks
from shardstream.shard_builder.tokenize import TokenizerSpec, token_dtype

__all__ = [
    "BUILDER_VERSION",
    "TEXT_SUFFIXES",
    "TextSource",
    "TokenizedKind",
    "file_source",
    "too_little_input",
]

TEXT_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")
BUILDER_VERSION = 1  # bump when the same inputs would give other bytes


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


class TokenizedKind(CutKind):
    """A tokenized build for :func:`~.pipeline.run_build`: its source is the chunks of the
    inputs; a subclass states its columns (:meth:`make_columns`), its cut
    (:meth:`~.cut.CutKind.cut`, started at :attr:`position` by :meth:`open_cut`) and
    what ``shardstream.json`` says of its samples (:meth:`shape_metadata`).

    Journal records count in chunks: the stream position after the shard, and the
    documents before that position's chunk (:meth:`resume_at`). The counters ``tokens``,
    ``documents`` and ``dropped`` end in ``shardstream.json``.
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

    @abstractmethod
    def make_columns(self) -> dict[str, str]:
        """The shards' columns."""

    @abstractmethod
    def open_cut(self) -> None:
        """Start cutting at :attr:`position` (and set :attr:`layout`)."""

    @abstractmethod
    def shape_metadata(self) -> dict[str, Any]:
        """What ``shardstream.json`` says of the samples' shape."""

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def journal_fingerprint(self) -> str:
        return fingerprint({"content": self._fingerprint, "chunks": self.config.chunk_bytes})

    @property
    def units(self) -> Sequence[Any]:
        return self.source.chunks

    def start(self, run: BuildRun) -> int:
        resume = run.resume
        self.position = StreamPosition.from_dict(resume["stream"]) if resume else self.position
        self.documents = int(resume.get("documents_before_chunk", 0))
        self.skipped.restore(resume.get("skipped_before_chunk"))
        self.tokens = self.position.tokens_before
        if run.final:
            self.documents, self.dropped = resume["docs"], resume["dropped"]
            self.skipped.restore(resume.get("skipped"))
        self.open_cut()
        return self.position.chunk

    def resume_at(self, position: StreamPosition) -> dict[str, Any]:
        """The journal record of a shard after which the input stands at ``position``
        (within the chunk being cut: :attr:`documents` count the chunks before it)."""
        resume: dict[str, Any] = {
            "stream": position.to_dict(),
            "documents_before_chunk": self.documents,
        }
        if self.config.skip_bad:
            resume["skipped_before_chunk"] = self.skipped.state()
        return resume

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
        return {
            "kind": "text",
            "fingerprint": self._fingerprint,
            "columns": self.columns,
            **self.shape_metadata(),
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
