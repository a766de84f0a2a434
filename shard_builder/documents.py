"""Document builds (``build text --documents``): one variable-length token array per document.

A document build is a tokenized build whose samples are whole documents instead of
fixed-length sequences, for readers that pack at read time (``PackOptions``). It supplies
only what differs from its sibling, the text kind (:mod:`.text`): the encoder and the shard
cut (:class:`DocumentKind`); the rest is their parent (:mod:`.tokenized`: inputs,
fingerprint, journal records, metadata) and the builder's one pipeline (:mod:`.pipeline`:
journal and resume, sink, index):

* workers read a chunk's records (:func:`~.text_source.read_records`), tokenize them and
  encode each document as one sample (:func:`encode_documents`): its ids followed by EOS,
  one ``ndarray:<uint16|uint32>`` value (variable length); with a ``prompt_field`` a
  record is a chat/SFT pair, stored as prompt + response + EOS with a ``loss_mask``
  (``ndarray:uint8``) that is 1 on the response and its EOS;
* from each document's encoded size alone, in chunk order, :meth:`DocumentKind.cut` cuts
  shards greedily by size (:class:`~.packing.GreedyCut`, as the image builder does): this
  process writes them with the codec's :func:`~shardstream.mds.write_shard`, and on Ray
  (:mod:`.cluster.driver`) the driver makes the same cut from the sizes the actors return
  and the actors write the shards;
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
from shardstream.shard_builder.cut import Counted, CutShard, ShardLayout
from shardstream.shard_builder.document_layout import document_layout
from shardstream.shard_builder.packing import Piece, StreamPosition, greedy_cut
from shardstream.shard_builder.text_source import TextChunk, read_records
from shardstream.shard_builder.tokenize import TokenizerSpec
from shardstream.shard_builder.tokenized import TokenizedKind

__all__ = [
    "ChunkDocuments",
    "DocumentKind",
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

    @property
    def items(self) -> int:
        """Documents in the chunk."""
        return len(self.samples)

    @property
    def payload(self) -> list[bytes]:
        """What shards take pieces of: the samples."""
        return self.samples

    def count(self) -> DocumentSizes:
        """What the cut needs: the samples' sizes and tokens."""
        sizes = np.fromiter(map(len, self.samples), dtype=np.int64, count=len(self.samples))
        return DocumentSizes(sizes, self.tokens)


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


class DocumentKind(TokenizedKind):
    """A document build: one sample per document, shards cut greedily by size. Journal
    records count documents: ``skip`` of the position is the documents of its chunk
    already stored.

    The cut (:meth:`cut`, :meth:`cut_last`) sees only sizes, so a Ray build makes it too
    (:mod:`.cluster.driver`).
    """

    def make_columns(self) -> dict[str, str]:
        return document_columns(self.config, self.dtype)

    def shape_metadata(self) -> dict[str, Any]:
        return {"layout": "documents"}

    def open_cut(self) -> None:
        self.layout = ShardLayout(self.columns)
        self._cut = greedy_cut(self.columns, self.config)
        self._open: list[Piece] = []  # the open shard: documents [start, end) of chunks

    def task(self, number: int, unit: Any) -> DocumentTask:
        config = self.config
        fields = (
            (config.field,) if config.prompt_field is None else (config.prompt_field, config.field)
        )
        return DocumentTask(unit, fields, self.spec, self.dtype.name, self.columns)

    work = staticmethod(encode_documents)

    def skip(self, number: int) -> int:
        """Documents of chunk ``number`` a killed run already stored."""
        return self.position.skip if number == self.position.chunk else 0

    def cut(self, number: int, count: DocumentSizes) -> Counted:
        """Take chunk ``number``'s documents (all before it were taken): the shards they
        close, in order. Counts :attr:`tokens` and :attr:`documents`."""
        closed = []
        skip, tokens_before = self.skip(number), self.tokens
        sizes, tokens = count.sizes.tolist(), count.tokens.tolist()
        for doc in range(skip, len(sizes)):
            if self._cut.add(sizes[doc]):
                closed.append(self._close(self.resume_at(StreamPosition(number, doc, self.tokens))))
            if self._open and self._open[-1].chunk == number:
                self._open[-1] = Piece(number, self._open[-1].start, doc + 1)
            else:
                self._open.append(Piece(number, doc, doc + 1))
            self.tokens += tokens[doc]
        self.documents += len(sizes)
        added = self.tokens - tokens_before
        progress = {"documents": len(sizes) - skip, "tokens": added}
        return Counted(closed, len(sizes) - skip, added * self.dtype.itemsize, progress)

    def cut_last(self) -> CutShard | None:
        """After the last chunk: the last shard, if documents are left."""
        return self._close(self.final_resume()) if self._open else None

    def needed(self, number: int) -> bool:
        """Whether the open shard takes documents of chunk ``number``."""
        return any(piece.chunk == number for piece in self._open)

    def _close(self, resume: dict[str, Any]) -> CutShard:
        shard = CutShard(tuple(self._open), resume)
        self._open = []
        return shard
