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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.errors import InputError
from shardstream.mds import ShardInfo, samples_per_shard, write_shard_arrays
from shardstream.shard_builder.config import TextBuildConfig, content_options
from shardstream.shard_builder.inputs import lineage, resolve_inputs
from shardstream.shard_builder.journal import BuildJournal, fingerprint, shard_key
from shardstream.shard_builder.packing import StreamPosition, TokenPacker
from shardstream.shard_builder.progress import BuildProgress
from shardstream.shard_builder.result import (
    BuildResult,
    completed_result,
    existing_result,
    finish_build,
)
from shardstream.shard_builder.sink import ShardSink
from shardstream.shard_builder.text_source import TextChunk, plan_chunks, read_docs
from shardstream.shard_builder.tokenize import TokenizerSpec, token_dtype
from shardstream.shard_builder.workers import ordered_map

TEXT_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".pq")
BUILDER_VERSION = 1  # bump when the same inputs would give other bytes


@dataclass(frozen=True)
class ChunkTask:
    """One unit of work: a chunk to read and tokenize into ``dtype`` ids."""

    chunk: TextChunk
    field: str
    tokenizer: TokenizerSpec
    dtype: str


@dataclass(frozen=True)
class ChunkTokens:
    """A chunk's token stream (every document + EOS) and its document count."""

    tokens: npt.NDArray[Any]
    documents: int


def tokenize_chunk(task: ChunkTask) -> ChunkTokens:
    """Worker: read one chunk's documents and tokenize them (a worker process or Ray actor)."""
    tokenizer = task.tokenizer.load()
    parts: list[npt.NDArray[Any]] = []
    documents = 0
    for docs in read_docs(task.chunk, task.field):
        if docs:
            parts.append(tokenizer.encode_docs(docs).astype(task.dtype, copy=False))
            documents += len(docs)
    tokens = np.concatenate(parts) if parts else np.empty(0, task.dtype)
    return ChunkTokens(tokens, documents)


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


@dataclass
class TextJob:
    """The middle of a text build: what a producer of shards is given.

    A producer (this process with worker processes, or the Ray builder) tokenizes
    ``chunks[start.chunk:]``, cuts the stream with :class:`StreamCutter` rules into shards
    continuing after ``shards`` (the finished ones), stores each, records it in ``journal``
    in shard order, moves ``progress``, and returns the totals.
    """

    config: TextBuildConfig
    source: TextSource
    chunks: Sequence[Any]  # TextChunk (files), or what ``source`` holds
    spec: TokenizerSpec
    dtype: np.dtype[Any]
    columns: dict[str, str]
    samples_per_shard: int
    sink: ShardSink
    journal: BuildJournal
    shards: list[ShardInfo]
    start: StreamPosition
    documents: int  # documents before ``start.chunk``
    progress: BuildProgress


@dataclass(frozen=True)
class TextTotals:
    """What a producer reports at the end: stream tokens, documents, tokens dropped."""

    tokens: int
    documents: int
    dropped: int


TextProducer = Callable[[TextJob], TextTotals]


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
    if config.documents:
        from shardstream.shard_builder.documents import produce_documents

        return run_text_build(config, produce_documents)
    return run_text_build(config, _produce_locally)


def run_text_build(
    config: TextBuildConfig, produce: TextProducer, source: TextSource | None = None
) -> BuildResult:
    """Everything of a text build but the tokenizing and shard writing, which ``produce`` does.

    Planning, fingerprint, journal and resume, ``shardstream.json`` and ``index.json`` live
    here once, so the local and the Ray builder write the same bytes and share journals.
    ``source`` is what is read (default: :func:`file_source`).
    """
    started = time.perf_counter()
    source = source or file_source(config)
    spec = TokenizerSpec(config.tokenizer, config.eos_token)
    tokenizer = spec.load()
    dtype = token_dtype(tokenizer.vocab_size)
    if config.documents:
        from shardstream.shard_builder.documents import document_columns

        columns = document_columns(config, dtype)
    else:
        columns = {config.column: f"ndarray:{dtype.name}:{config.seq_len}"}
    chunks = source.chunks
    described = tokenizer.describe()
    fp = fingerprint(
        {
            "builder": BUILDER_VERSION,
            "options": content_options(config),
            "lineage": source.lineage,
            "tokenizer": {k: v for k, v in described.items() if k != "path"},
        }
    )
    sink = ShardSink(config.output)
    try:
        if config.overwrite:
            sink.check_empty(overwrite=True)
        elif (done_result := existing_result(sink, fp)) is not None:
            return done_result
        # Journal positions count in chunks: a resume must cut the input the same way.
        journal = BuildJournal(sink, fingerprint({"content": fp, "chunks": config.chunk_bytes}))
        done = journal.start()
        per_shard = (
            0  # documents: shards are cut by size
            if config.documents
            else samples_per_shard(
                columns, config.shard_size, compression=config.compression, hashes=config.hashes
            )
        )
        resume = done[-1].resume if done else {}
        start = StreamPosition.from_dict(resume["stream"]) if done else StreamPosition(0, 0, 0)
        progress = BuildProgress(
            sum(c.nbytes for c in chunks), desc="build text", enabled=config.progress
        )
        job = TextJob(
            config=config,
            source=source,
            chunks=chunks,
            spec=spec,
            dtype=dtype,
            columns=columns,
            samples_per_shard=per_shard,
            sink=sink,
            journal=journal,
            shards=[d.info for d in done],
            start=start,
            documents=int(resume.get("documents_before_chunk", 0)),
            progress=progress,
        )
        with progress:
            progress.skip(sum(c.nbytes for c in chunks[: start.chunk]))
            if resume.get("final"):
                totals = TextTotals(start.tokens_before, resume["docs"], resume["dropped"])
            else:
                totals = produce(job)
            sink.flush()
        metadata: dict[str, Any] = {
            "kind": "text",
            "fingerprint": fp,
            "columns": columns,
            **({"layout": "documents"} if config.documents else {"seq_len": config.seq_len}),
            "tokenizer": described,
            "eos_id": tokenizer.eos_id,
            "vocab_size": tokenizer.vocab_size,
            "tokens": totals.tokens,
            "documents": totals.documents,
            "dropped_tokens": totals.dropped,
            "config": content_options(config),
            "lineage": source.lineage,
        }
        index = finish_build(sink, job.shards, metadata)
        journal.clear()
    except InputError:
        sink.discard_partial()  # fixing the input changes it: nothing here can be reused
        raise
    finally:
        sink.close()
    return completed_result(
        sink,
        index,
        metadata,
        config=config,
        reused_shards=len(done) + journal.reused_later,
        started=started,
    )


def final_resume(job: TextJob, tokens: int, documents: int, dropped: int) -> dict[str, Any]:
    """The journal record of the last shard: the end of the stream and the final counts."""
    end = StreamPosition(len(job.chunks), 0, tokens)
    return {"stream": end.to_dict(), "final": True, "dropped": dropped, "docs": documents}


def _produce_locally(job: TextJob) -> TextTotals:
    """Tokenize in worker processes (results in chunk order), write shards here."""
    config, start, shards, sink = job.config, job.start, job.shards, job.sink
    documents = job.documents

    def write(block: npt.NDArray[Any], info_resume: dict[str, Any]) -> None:
        position = len(shards)
        shards.append(
            job.journal.take_or_store(
                position,
                info_resume,
                lambda: write_shard_arrays(
                    sink.staging,
                    shard_key(position, config.spread_prefixes),
                    job.columns,
                    {config.column: block},
                    **config.shard_format(),
                ),
            )
        )

    packer = TokenPacker(config.seq_len, job.samples_per_shard, job.dtype, start)
    tasks = (
        ChunkTask(chunk, config.field, job.spec, job.dtype.name)
        for chunk in job.chunks[start.chunk :]
    )
    results = ordered_map(tokenize_chunk, tasks, workers=config.workers)
    reported, sample_bytes = 0, config.seq_len * job.dtype.itemsize
    for number, chunk_tokens in enumerate(results, start=start.chunk):
        for block, pos in packer.add(number, chunk_tokens.tokens):
            write(block, {"stream": pos.to_dict(), "documents_before_chunk": documents})
        documents += chunk_tokens.documents
        # Whole sequences so far: the rate users care about, before a shard ends.
        sequences = (packer.tokens_seen - start.tokens_before) // config.seq_len
        new, reported = sequences - reported, sequences
        job.progress.advance(job.chunks[number].nbytes, new, new * sample_bytes)
    last, dropped = packer.finish()
    tokens = packer.tokens_seen
    if not shards and not len(last):
        raise too_little_input(config, job.source.names, documents, tokens)
    if len(last):
        write(last, final_resume(job, tokens, documents, dropped))
    return TextTotals(tokens, documents, dropped)


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
