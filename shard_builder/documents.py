"""Document builds (``build text --documents``): one variable-length token array per document.

A document build is a text build whose samples are whole documents instead of fixed-length
sequences, for readers that pack at read time (``PackOptions``). It supplies only what
differs, the encoder and the shard cut (:class:`DocumentKind`); the rest is the text kind
and the builder's one pipeline (:mod:`.pipeline`: inputs, fingerprint, journal and resume,
sink, index, metadata):

* workers read a chunk's records (:func:`~.text_source.read_records`), tokenize them and
  encode each document as one sample (:func:`encode_documents`): its ids followed by EOS,
  one ``ndarray:<uint16|uint32>`` value (variable length); with a ``prompt_field`` a
  record is a chat/SFT pair, stored as prompt + response + EOS with a ``loss_mask``
  (``ndarray:uint8``) that is 1 on the response and its EOS;
* from each document's encoded size alone, in chunk order, :meth:`DocumentKind.cut` cuts
  shards greedily by size (:class:`~.packing.GreedyCut`, as the image builder does): this
  process writes them with the codec's :func:`~shardstream.mds.write_shard`, and on Ray
  (:mod:`.cluster.documents`) the driver makes the same cut from the sizes the actors
  return and the actors write the shards;
* after every stored shard the journal records the next document as ``(chunk, documents
  of it already stored)``, a :class:`~.packing.StreamPosition` counting documents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.mds import make_encoder
from shardstream.shard_builder.config import MASK_COLUMN, TextBuildConfig
from shardstream.shard_builder.document_layout import document_layout
from shardstream.shard_builder.images import shard_header_bytes
from shardstream.shard_builder.packing import GreedyCut, StreamPosition
from shardstream.shard_builder.pipeline import BuildRun
from shardstream.shard_builder.text import TextKind
from shardstream.shard_builder.text_source import TextChunk, read_records
from shardstream.shard_builder.tokenize import TokenizerSpec

__all__ = [
    "ChunkDocuments",
    "DocumentKind",
    "DocumentShard",
    "DocumentSizes",
    "DocumentTask",
    "EncodedDocuments",
    "document_columns",
    "encode_documents",
]


def document_columns(config: TextBuildConfig, dtype: np.dtype[Any]) -> dict[str, str]:
    """The columns of a document build: tokens (variable length), and the loss mask."""
    return document_layout(config.column, dtype, masked=config.prompt_field is not None)


@dataclass(frozen=True)
class DocumentTask:
    """One unit of work: a chunk's records (``fields``) to tokenize into ``dtype`` ids and
    encode as samples of ``columns``."""

    chunk: TextChunk
    fields: tuple[str, ...]  # (text,) or (prompt, response)
    tokenizer: TokenizerSpec
    dtype: str
    columns: dict[str, str]


@dataclass(frozen=True)
class ChunkDocuments:
    """A chunk's documents: their tokens end to end, each one's length, and the mask."""

    tokens: npt.NDArray[Any]
    lengths: npt.NDArray[np.int64]
    mask: npt.NDArray[np.uint8] | None

    @property
    def documents(self) -> int:
        """Documents in the chunk."""
        return len(self.lengths)


@dataclass(frozen=True)
class DocumentSizes:
    """What the shard cut needs of a chunk's documents (all a Ray driver gets of them):
    each one's encoded size and its tokens."""

    sizes: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]

    @property
    def documents(self) -> int:
        """Documents in the chunk."""
        return len(self.sizes)


@dataclass(frozen=True)
class EncodedDocuments:
    """A chunk's documents as samples (one each, in order) and each one's tokens."""

    samples: list[bytes]
    tokens: npt.NDArray[np.int64]

    def sizes(self) -> DocumentSizes:
        """The samples' sizes and tokens, for the cut."""
        sizes = np.fromiter(map(len, self.samples), dtype=np.int64, count=len(self.samples))
        return DocumentSizes(sizes, self.tokens)


@dataclass(frozen=True)
class DocumentShard:
    """A shard the cut closed: its documents as ``(chunk, start, end)`` ranges of the
    chunks' samples, in order, and its journal record (where the input stands after it)."""

    ranges: tuple[tuple[int, int, int], ...]
    resume: dict[str, Any]


def encode_documents(task: DocumentTask) -> EncodedDocuments:
    """Worker (a process, or a Ray actor): read one chunk's records, tokenize every
    document (EOS included) and encode each as one sample of ``task.columns``."""
    docs = tokenize_documents(task)
    encode = make_encoder(task.columns)
    column = next(iter(task.columns))  # the token column comes first (document_layout)
    samples: list[bytes] = []
    begin = 0
    for end in np.cumsum(docs.lengths).tolist():
        sample: dict[str, Any] = {column: docs.tokens[begin:end]}
        if docs.mask is not None:
            sample[MASK_COLUMN] = docs.mask[begin:end]
        samples.append(encode(sample))
        begin = end
    return EncodedDocuments(samples, docs.lengths)


def tokenize_documents(task: DocumentTask) -> ChunkDocuments:
    """Worker: read one chunk's records and tokenize every document (EOS included)."""
    tokenizer = task.tokenizer.load()
    tokens: list[npt.NDArray[Any]] = []
    lengths: list[npt.NDArray[np.int64]] = []
    masks: list[npt.NDArray[np.uint8]] = []
    for records in read_records(task.chunk, task.fields):
        if not records:
            continue
        if len(task.fields) == 1:
            ids, lens = tokenizer.encode_lengths([r[0] for r in records])
            tokens.append(ids.astype(task.dtype, copy=False))
            lengths.append(lens)
            continue
        prompt, prompt_lens = tokenizer.encode_lengths([r[0] for r in records])
        reply, reply_lens = tokenizer.encode_lengths([r[1] for r in records])
        ids, mask = _join_pairs(prompt, prompt_lens, reply, reply_lens)
        tokens.append(ids.astype(task.dtype, copy=False))
        lengths.append(prompt_lens - 1 + reply_lens)
        masks.append(mask)
    return ChunkDocuments(
        np.concatenate(tokens) if tokens else np.empty(0, task.dtype),
        np.concatenate(lengths) if lengths else np.empty(0, np.int64),
        (np.concatenate(masks) if masks else np.empty(0, np.uint8))
        if len(task.fields) > 1
        else None,
    )


def _join_pairs(
    prompt: npt.NDArray[Any],
    prompt_lens: npt.NDArray[np.int64],
    reply: npt.NDArray[Any],
    reply_lens: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]:
    """Each prompt without its EOS, then its reply with EOS; mask 0 on prompts, 1 on replies."""
    keep = np.ones(len(prompt), dtype=bool)
    keep[np.cumsum(prompt_lens) - 1] = False  # every prompt's EOS
    p_ends = np.cumsum(prompt_lens - 1)
    r_ends = np.cumsum(reply_lens)
    total = int(p_ends[-1] + r_ends[-1]) if len(p_ends) else 0
    out = np.empty(total, dtype=np.result_type(prompt.dtype, reply.dtype))
    mask = np.zeros(total, dtype=np.uint8)
    prompts = prompt[keep]
    pos = p_start = r_start = 0
    for p_end, r_end in zip(p_ends.tolist(), r_ends.tolist(), strict=True):
        n = p_end - p_start
        out[pos : pos + n] = prompts[p_start:p_end]
        pos += n
        m = r_end - r_start
        out[pos : pos + m] = reply[r_start:r_end]
        mask[pos : pos + m] = 1
        pos += m
        p_start, r_start = p_end, r_end
    return out, mask


class DocumentKind(TextKind):
    """A document build: the text kind with this encoder (one sample per document, shards
    cut greedily by size). Journal records count documents: ``skip`` of the position is
    the documents of its chunk already stored.

    The cut (:meth:`cut`, :meth:`cut_last`) sees only sizes, so the Ray driver makes it
    too (:mod:`.cluster.documents`); :meth:`add` applies it to the samples here.
    """

    def make_columns(self) -> dict[str, str]:
        return document_columns(self.config, self.dtype)

    def open_encoder(self) -> None:
        self._cut = GreedyCut(shard_header_bytes(self.columns, self.config), self.config.shard_size)  # type: ignore[arg-type]
        self._open: list[tuple[int, int, int]] = []  # the open shard: (chunk, start, end)
        self._held: dict[int, list[bytes]] = {}  # samples of the chunks it takes

    def task(self, number: int, unit: Any) -> Any:
        config = self.config
        fields = (
            (config.field,) if config.prompt_field is None else (config.prompt_field, config.field)
        )
        return DocumentTask(unit, fields, self.spec, self.dtype.name, self.columns)

    work = staticmethod(encode_documents)

    def skip(self, number: int) -> int:
        """Documents of chunk ``number`` a killed run already stored."""
        return self.position.skip if number == self.position.chunk else 0

    def cut(self, number: int, docs: DocumentSizes) -> list[DocumentShard]:
        """Take chunk ``number``'s documents (all before it were taken): the shards they
        close, in order. Counts :attr:`tokens` and :attr:`documents`."""
        closed = []
        sizes, tokens = docs.sizes.tolist(), docs.tokens.tolist()
        for doc in range(self.skip(number), len(sizes)):
            if self._cut.add(sizes[doc]):
                position = StreamPosition(number, doc, self.tokens)
                resume = {"stream": position.to_dict(), "documents_before_chunk": self.documents}
                closed.append(self._close(resume))
            if self._open and self._open[-1][0] == number:
                self._open[-1] = (number, self._open[-1][1], doc + 1)
            else:
                self._open.append((number, doc, doc + 1))
            self.tokens += tokens[doc]
        self.documents += len(sizes)
        return closed

    def cut_last(self) -> DocumentShard | None:
        """After the last chunk: the last shard, if documents are left."""
        return self._close(self.final_resume()) if self._open else None

    def needed(self, number: int) -> bool:
        """Whether the open shard takes documents of chunk ``number``."""
        return any(chunk == number for chunk, _, _ in self._open)

    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        docs: EncodedDocuments = result
        skip, tokens_before = self.skip(number), self.tokens
        self._held[number] = docs.samples
        for shard in self.cut(number, docs.sizes()):
            self._store(run, shard)
        self._held = {n: held for n, held in self._held.items() if self.needed(n)}
        return len(docs.samples) - skip, (self.tokens - tokens_before) * self.dtype.itemsize

    def finish(self, run: BuildRun) -> None:
        if (last := self.cut_last()) is not None:
            self._store(run, last)

    def _close(self, resume: dict[str, Any]) -> DocumentShard:
        shard = DocumentShard(tuple(self._open), resume)
        self._open = []
        return shard

    def _store(self, run: BuildRun, shard: DocumentShard) -> None:
        samples = [s for n, lo, hi in shard.ranges for s in self._held[n][lo:hi]]
        run.store_samples(shard.resume, self.columns, samples)
