"""``build_text`` on a Ray cluster: the same shards, tokenized and written by the workers.

The driver plans the chunks exactly as the local builder does (the same
:class:`~shardstream.shard_builder.text.TextKind` in the builder's one pipeline:
fingerprint, journal, resume, index), and the pipeline's ordered workers are actors
(:mod:`.driver`):

1. actors tokenize chunks (a window of them ahead); each chunk's tokens stay in the
   object store of the actor's node, the driver gets the token count;
2. taking the counts in chunk order, the driver cuts the stream with the local builder's
   :class:`StreamCutter`: shard boundaries depend on the input order only, never on which
   worker finished first;
3. each shard is written and uploaded by the actor that holds most of its tokens (the rest
   come from other nodes' object stores), which returns the shard's :class:`ShardInfo`;
4. the worker records the shard in the journal before it puts the shard in place, so a
   re-run after a kill (of the driver or of a node) continues after the last shard of the
   unbroken run and takes every later shard it finds recorded as it is (same position,
   same stream position after it) instead of writing it again.
"""

from __future__ import annotations

from typing import Any

from shardstream.errors import ConfigError
from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import (
    BlockChunk,
    is_url,
    text_source,
    text_url_source,
)
from shardstream.shard_builder.cluster.documents import drive_documents
from shardstream.shard_builder.cluster.driver import ActorDriver
from shardstream.shard_builder.cluster.pool import WorkerPool, build_on_pool
from shardstream.shard_builder.cluster.worker import BlockTask, TokenCount, TokenShard
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.documents import DocumentKind
from shardstream.shard_builder.packing import ShardCut, StreamCutter
from shardstream.shard_builder.pipeline import BuildRun
from shardstream.shard_builder.result import BuildResult
from shardstream.shard_builder.text import TextKind, text_kind


def build_text_on_ray(
    config: TextBuildConfig,
    ray: RayOptions | None = None,
    *,
    dataset: Any = None,
    lineage: list[dict[str, Any]] | None = None,
) -> BuildResult:
    """:func:`~shardstream.shard_builder.build_text` with Ray workers: byte-identical output
    (with ``config.documents`` too: one sample per document, see :mod:`.documents`).

    The inputs are ``config.inputs`` (paths every node can read, or ``s3://`` URLs, which
    Ray Data reads), or ``dataset``: a ``ray.data.Dataset`` with a ``config.field`` text
    column, whose rows are the documents in order (``config.inputs`` then only names it;
    ``lineage`` describes its source for the fingerprint and ``shardstream.json``; not
    with ``config.documents``, whose inputs are files, a :class:`ConfigError` otherwise).
    ``config.workers`` is ignored; ``ray.workers`` (default: every CPU of the cluster) sets
    the number of worker actors. The result's ``workers`` holds each actor's numbers.

    Example::

        result = build_text_on_ray(
            TextBuildConfig(output="s3://bucket/corpus", inputs=("/shared/corpus",)),
            RayOptions(address="auto"),
        )
    """
    if config.skip_bad:
        raise ConfigError(
            "--skip-bad is not available with --ray yet: build without --ray, or fix or "
            "remove the bad lines (a build without --skip-bad names the first)"
        )
    url_inputs = any(is_url(name) for name in config.inputs)
    if config.documents and (dataset is not None or url_inputs):
        raise ConfigError(
            "--documents on Ray reads input files every node can read (a shared file "
            "system), as the local build does; s3:// inputs and Ray datasets are read for "
            "fixed-length builds only: copy the files to a shared path, or leave out "
            "--documents"
        )
    options = ray or RayOptions()
    with ray_session(options) as ray_module:
        source = None
        if dataset is not None:
            source = text_source(ray_module, dataset, config, lineage)
        elif url_inputs:
            source = text_url_source(ray_module, config)

        return build_on_pool(ray_module, config, options, lambda: text_kind(config, source), _drive)


def _drive(kind: TextKind, run: BuildRun, pool: WorkerPool) -> None:
    if isinstance(kind, DocumentKind):
        drive_documents(kind, run, pool)  # --documents: one sample per document
    else:
        _TextDriver(kind, run, pool).drive()


class _TextDriver(ActorDriver):
    """Text on actors: they tokenize chunks; the driver cuts the stream with the local
    builder's :class:`StreamCutter` from the token counts (see the module doc)."""

    def __init__(self, kind: TextKind, run: BuildRun, pool: WorkerPool) -> None:
        super().__init__(run, pool, len(kind.units))
        self.kind = kind
        self.cutter = StreamCutter(kind.config.seq_len, kind.samples_per_shard, kind.position)
        self.reported = 0

    def call(self, number: int) -> tuple[str, tuple[Any, ...]]:
        kind, unit = self.kind, self.kind.units[number]
        if isinstance(unit, BlockChunk):  # a Ray Data block: passed by reference
            block = BlockTask(
                kind.config.field, kind.spec, kind.dtype.name, unit.number, unit.nbytes
            )
            return "tokenize_block", (block, unit.ref)
        return "tokenize", (kind.task(number, unit),)

    def counted(self, number: int, count: TokenCount) -> None:
        kind = self.kind
        for cut in self.cutter.add(number, count.tokens):
            self._write(
                cut, {"stream": cut.position.to_dict(), "documents_before_chunk": kind.documents}
            )
        kind.documents += count.documents
        first = self.cutter.first_needed
        self.release(lambda chunk: first is not None and chunk >= first)
        seq_len = kind.config.seq_len
        sequences = (self.cutter.tokens_seen - kind.position.tokens_before) // seq_len
        new, self.reported = sequences - self.reported, sequences
        self.run.progress.advance(
            kind.units[number].nbytes,
            new,
            new * seq_len * kind.dtype.itemsize,
            documents=count.documents,
            tokens=count.tokens,
        )

    def finish(self) -> None:
        last, self.kind.dropped = self.cutter.finish()
        self.kind.tokens = self.cutter.tokens_seen
        if last is not None:
            self._write(last, self.kind.final_resume())

    def _write(self, cut: ShardCut, resume: dict[str, Any]) -> None:
        shares: dict[int, int] = {}
        for piece in cut.pieces:
            shares[piece.chunk] = shares.get(piece.chunk, 0) + piece.end - piece.start
        kind = self.kind
        shard = TokenShard(
            self.next_position, cut.pieces, tuple(shares), kind.columns, kind.config.seq_len, resume
        )
        self.write(resume, shares, "write_tokens", shard)
