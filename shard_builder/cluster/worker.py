"""The build worker: one Ray actor per CPU, doing every step but the bookkeeping.

An actor tokenizes (or encodes documents of, or checks images of) chunks with the local
builder's own functions,
keeping the tokenizer loaded for its lifetime; the results stay in the Ray object store of
its node and only their counts go to the driver. Asked to write a shard, it gathers that
shard's pieces (from its own node or another), writes the file with the MDS codec and
uploads it straight to the output (multipart, through :mod:`shardstream.storage`) after
writing its journal entry, and returns the :class:`ShardInfo`: the only thing of a shard
the driver ever holds.

This module does not import Ray; :mod:`.pool` turns :class:`BuildWorker` into an actor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.errors import InputError
from shardstream.mds import ShardInfo, write_shard, write_shard_arrays
from shardstream.shard_builder.cluster.dataset import block_items
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.documents import DocumentSizes, DocumentTask, encode_documents
from shardstream.shard_builder.images import CheckedImages, ImageTask, process_chunk
from shardstream.shard_builder.journal import JOURNAL_DIR, record_done, shard_key
from shardstream.shard_builder.packing import Piece, gather
from shardstream.shard_builder.result import WorkerStats
from shardstream.shard_builder.sink import local_output_dir
from shardstream.shard_builder.text import ChunkTask, tokenize_chunk
from shardstream.shard_builder.tokenize import TokenizerSpec
from shardstream.storage import open_store

_SHARD_MODE = 0o644
_BATCH = 8192  # documents per encode_batch call (as the Parquet reader's batches)


@dataclass(frozen=True)
class TokenCount:
    """What the driver learns of a tokenized chunk: its tokens and documents."""

    tokens: int
    documents: int


@dataclass(frozen=True)
class ImageCount:
    """What the driver learns of a checked chunk: item numbers, sample sizes, bad images."""

    numbers: list[int]
    sizes: list[int]
    bad: list[tuple[int, Any]]  # (item, BadInput)


@dataclass(frozen=True)
class BlockTask:
    """How to tokenize a Ray Data block (the block itself travels as a separate argument)."""

    field: str
    tokenizer: TokenizerSpec
    dtype: str
    number: int
    nbytes: int


@dataclass(frozen=True)
class TokenShard:
    """A text shard to write: its position, its pieces of which chunks' tokens, its column,
    and its journal entry's ``resume`` (where the stream stands after it)."""

    position: int
    pieces: tuple[Piece, ...]
    chunks: tuple[int, ...]
    columns: dict[str, str]
    seq_len: int
    resume: dict[str, Any]


@dataclass(frozen=True)
class SampleShard:
    """An image or document shard to write: its position, the ``(start, end)`` range of
    each sample list it takes, its columns, and its journal entry's ``state``."""

    position: int
    ranges: tuple[tuple[int, int], ...]
    columns: dict[str, str]
    state: dict[str, Any]


class WorkerOutput:
    """Where a worker puts a shard it wrote: the output folder, or the object store.

    The codec writes each shard into a staging folder; :meth:`store` then writes the
    shard's journal entry and only after it puts the shard under its name, so a shard that
    a re-run finds in the output always has its entry, however far the driver got (it is
    checked against the shard before it is reused; an entry whose shard never arrived is
    ignored).
    """

    def __init__(self, output: str) -> None:
        local = local_output_dir(output)
        self._store = open_store(output)
        self._local = local.absolute() if local is not None else None
        if self._local is not None:  # a path every node sees (one machine, or a shared FS)
            # Beside the shards (the same file system: a rename puts one in place), in the
            # journal's folder, which the build deletes at its end.
            staging = self._local / JOURNAL_DIR
            staging.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="worker-", dir=staging))
        else:
            self.folder = Path(tempfile.mkdtemp(prefix="shardstream-ray-"))

    def store(self, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
        """The codec wrote ``info``'s file into :attr:`folder`: journal it, then make it
        part of the output."""
        name = info.stored.basename
        path = self.folder / name
        record_done(self._store, position, info, resume)
        if self._local is not None:
            path.chmod(_SHARD_MODE)  # the codec's temp files are 0600
            final = self._local / name
            final.parent.mkdir(parents=True, exist_ok=True)  # a spread-prefix folder
            os.replace(path, final)
            return
        try:
            self._store.upload(path, name)
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the staging folder."""
        shutil.rmtree(self.folder, ignore_errors=True)


class BuildWorker:
    """A Ray actor (see :mod:`.pool`) that tokenizes, encodes documents, checks images and
    writes shards."""

    def __init__(self, output: str, options: OutputOptions) -> None:
        self._out = WorkerOutput(output)
        self._options = options
        self._name = f"{_node_name()} pid {os.getpid()}"
        self._chunks = self._items = self._input = self._shards = self._written = 0
        self._busy = 0.0
        self._cpu = 0.0
        self._cpu_mark = time.process_time()

    def name(self) -> str:
        """Node address and process id (also: answers once the actor is up)."""
        return self._name

    def node_id(self) -> str:
        """The Ray node this actor runs on (hex)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def tokenize(self, task: ChunkTask) -> tuple[TokenCount, npt.NDArray[Any]]:
        """Tokenize one chunk: its counts (for the driver) and its tokens (stay here)."""
        started = time.perf_counter()
        result = tokenize_chunk(task)
        self._account(started, chunks=1, items=result.documents, input_bytes=task.chunk.nbytes)
        return TokenCount(len(result.tokens), result.documents), result.tokens

    def tokenize_block(self, task: BlockTask, block: Any) -> tuple[TokenCount, npt.NDArray[Any]]:
        """Tokenize the documents of a Ray Data block (an Arrow table or pandas frame)."""
        started = time.perf_counter()
        field, number = task.field, task.number
        if hasattr(block, "column"):  # pyarrow.Table
            docs = block.column(field).to_pylist()
        else:
            docs = block[field].tolist()
        for row, doc in enumerate(docs):
            if not isinstance(doc, str):
                raise InputError(
                    f"dataset block {number}, row {row}: column {field!r} is "
                    f"{type(doc).__name__}, not a string"
                )
        tokenizer = task.tokenizer.load()
        parts = [
            tokenizer.encode_docs(docs[i : i + _BATCH]).astype(task.dtype, copy=False)
            for i in range(0, len(docs), _BATCH)
        ]
        tokens = np.concatenate(parts) if parts else np.empty(0, task.dtype)
        self._account(started, chunks=1, items=len(docs), input_bytes=task.nbytes)
        return TokenCount(len(tokens), len(docs)), tokens

    def encode_documents(self, task: DocumentTask) -> tuple[DocumentSizes, list[bytes]]:
        """Tokenize one chunk's documents and encode each as a sample: their sizes and
        tokens (for the driver's cut) and the samples (stay here, for ``write_samples``)."""
        started = time.perf_counter()
        encoded = encode_documents(task)
        docs = len(encoded.samples)
        self._account(started, chunks=1, items=docs, input_bytes=task.chunk.nbytes)
        return encoded.sizes(), encoded.samples

    def check_images(self, task: ImageTask) -> tuple[ImageCount, list[bytes]]:
        """Check one chunk of images: numbers, sizes and bad images; the samples stay here."""
        started = time.perf_counter()
        if task.chunk.block is not None:  # a Ray Data block: fetched from its node
            import ray

            block = ray.get(task.chunk.block)
            done: CheckedImages = process_chunk(task, block_items(task.chunk, block, task.skip))
        else:
            done = process_chunk(task)
        self._account(started, chunks=1, items=len(done.samples), input_bytes=task.chunk.nbytes)
        sizes = [len(s) for s in done.samples]
        return ImageCount(done.numbers, sizes, done.bad), done.samples

    def write_tokens(self, shard: TokenShard, *arrays: npt.NDArray[Any]) -> ShardInfo:
        """Write ``shard`` from its pieces of the chunks' token arrays (``arrays``, in the
        order of ``shard.chunks``), store it with its journal entry."""
        started = time.perf_counter()
        block = gather(shard.pieces, dict(zip(shard.chunks, arrays, strict=True)))
        (column,) = shard.columns
        opts = self._options
        info = write_shard_arrays(
            self._out.folder,
            shard_key(shard.position, opts.spread_prefixes),
            shard.columns,
            {column: np.ascontiguousarray(block).reshape(-1, shard.seq_len)},
            **opts.shard_format(),
        )
        self._out.store(shard.position, info, shard.resume)
        self._account(started, shards=1, written=info.stored.bytes)
        return info

    def write_samples(self, shard: SampleShard, *sample_lists: list[bytes]) -> ShardInfo:
        """Write ``shard`` from ``sample_lists[i][start:end]`` for each of its ranges, store
        it with its journal entry."""
        started = time.perf_counter()
        samples = [
            s for (lo, hi), got in zip(shard.ranges, sample_lists, strict=True) for s in got[lo:hi]
        ]
        opts = self._options
        info = write_shard(
            self._out.folder,
            shard_key(shard.position, opts.spread_prefixes),
            shard.columns,
            samples,
            **opts.shard_format(),
        )
        self._out.store(shard.position, info, shard.state)
        self._account(started, shards=1, written=info.stored.bytes)
        return info

    def stats(self) -> WorkerStats:
        """What this worker did so far."""
        return WorkerStats(
            name=self._name,
            chunks=self._chunks,
            items=self._items,
            input_bytes=self._input,
            busy_s=self._busy,
            cpu_s=self._cpu,
            shards=self._shards,
            written_bytes=self._written,
        )

    def close(self) -> None:
        """Remove the worker's staging folder."""
        self._out.close()

    def _account(
        self,
        started: float,
        *,
        chunks: int = 0,
        items: int = 0,
        input_bytes: int = 0,
        shards: int = 0,
        written: int = 0,
    ) -> None:
        self._busy += time.perf_counter() - started
        cpu = time.process_time()  # this process: the tokenizer's threads included
        self._cpu += cpu - self._cpu_mark
        self._cpu_mark = cpu
        self._chunks += chunks
        self._items += items
        self._input += input_bytes
        self._shards += shards
        self._written += written


def _node_name() -> str:
    """``10.0.0.5 node 3fa2c1d0``: the node's address and the start of its Ray node id."""
    with contextlib.suppress(Exception):
        import ray

        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return f"{ip} node {ray.get_runtime_context().get_node_id()[:8]}"
    return socket.gethostname()
