"""Document builds (``build text --documents``): one variable-length token array per document.

A document build is a text build whose samples are whole documents instead of fixed-length
sequences, for readers that pack at read time (``PackOptions``). It supplies only what
differs, the encoder and the shard cut (:class:`DocumentKind`); the rest is the text kind
and the builder's one pipeline (:mod:`.pipeline`: inputs, fingerprint, journal and resume,
sink, index, metadata):

* workers read a chunk's records (:func:`~.text_source.read_records`) and tokenize them:
  each document's ids followed by EOS, one ``ndarray:<uint16|uint32>`` value (variable
  length); with a ``prompt_field`` a record is a chat/SFT pair, stored as prompt +
  response + EOS with a ``loss_mask`` (``ndarray:uint8``) that is 1 on the response and
  its EOS;
* this process cuts shards greedily by size (:class:`~.packing.GreedyCut`, as the image
  builder does) and writes them with the codec's :func:`~shardstream.mds.write_shard`;
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
    "DocumentTask",
    "document_columns",
]


def document_columns(config: TextBuildConfig, dtype: np.dtype[Any]) -> dict[str, str]:
    """The columns of a document build: tokens (variable length), and the loss mask."""
    return document_layout(config.column, dtype, masked=config.prompt_field is not None)


@dataclass(frozen=True)
class DocumentTask:
    """One unit of work: a chunk's records (``fields``) to tokenize into ``dtype`` ids."""

    chunk: TextChunk
    fields: tuple[str, ...]  # (text,) or (prompt, response)
    tokenizer: TokenizerSpec
    dtype: str


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
    the documents of its chunk already stored."""

    def make_columns(self) -> dict[str, str]:
        return document_columns(self.config, self.dtype)

    def open_encoder(self) -> None:
        self._encode = make_encoder(self.columns)
        self._cut = GreedyCut(shard_header_bytes(self.columns, self.config), self.config.shard_size)  # type: ignore[arg-type]
        self._pending: list[bytes] = []

    def task(self, number: int, unit: Any) -> Any:
        config = self.config
        fields = (
            (config.field,) if config.prompt_field is None else (config.prompt_field, config.field)
        )
        return DocumentTask(unit, fields, self.spec, self.dtype.name)

    work = staticmethod(tokenize_documents)

    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        docs: ChunkDocuments = result
        column = self.config.column
        skip = self.position.skip if number == self.position.chunk else 0
        ends = np.cumsum(docs.lengths).tolist()
        begin = 0 if skip == 0 else ends[skip - 1]
        written = 0
        for doc in range(skip, docs.documents):
            end = ends[doc]
            sample: dict[str, Any] = {column: docs.tokens[begin:end]}
            if docs.mask is not None:
                sample[MASK_COLUMN] = docs.mask[begin:end]
            data = self._encode(sample)
            if self._cut.add(len(data)):
                position = StreamPosition(number, doc, self.tokens)
                self._close(
                    run, {"stream": position.to_dict(), "documents_before_chunk": self.documents}
                )
            self._pending.append(data)
            self.tokens += end - begin
            written += end - begin
            begin = end
        self.documents += docs.documents
        return docs.documents - skip, written * self.dtype.itemsize

    def finish(self, run: BuildRun) -> None:
        if self._pending:
            self._close(run, self.final_resume())

    def _close(self, run: BuildRun, resume: dict[str, Any]) -> None:
        run.store_samples(resume, self.columns, self._pending)
        self._pending = []
