"""``build_text`` on a Ray cluster: the same shards, tokenized and written by the workers.

The driver plans the chunks exactly as the local builder does (:func:`run_text_build`
is shared: fingerprint, journal, resume, index). Then:

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

from collections import deque
from dataclasses import dataclass
from typing import Any

from shardstream.errors import ConfigError
from shardstream.mds import ShardInfo
from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import (
    BlockChunk,
    is_url,
    text_source,
    text_url_source,
)
from shardstream.shard_builder.cluster.pool import WorkerPool, build_on_pool
from shardstream.shard_builder.cluster.worker import BlockTask, TokenCount, TokenShard
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.packing import ShardCut, StreamCutter
from shardstream.shard_builder.result import BuildResult
from shardstream.shard_builder.text import (
    ChunkTask,
    TextJob,
    TextTotals,
    final_resume,
    run_text_build,
    too_little_input,
)

_MB = 1 << 20


def build_text_on_ray(
    config: TextBuildConfig,
    ray: RayOptions | None = None,
    *,
    dataset: Any = None,
    lineage: list[dict[str, Any]] | None = None,
) -> BuildResult:
    """:func:`~shardstream.shard_builder.build_text` with Ray workers: byte-identical output.

    The inputs are ``config.inputs`` (paths every node can read, or ``s3://`` URLs, which
    Ray Data reads), or ``dataset``: a ``ray.data.Dataset`` with a ``config.field`` text
    column, whose rows are the documents in order (``config.inputs`` then only names it;
    ``lineage`` describes its source for the fingerprint and ``shardstream.json``).
    ``config.workers`` is ignored; ``ray.workers`` (default: every CPU of the cluster) sets
    the number of worker actors. The result's ``workers`` holds each actor's numbers.

    Example::

        result = build_text_on_ray(
            TextBuildConfig(output="s3://bucket/corpus", inputs=("/shared/corpus",)),
            RayOptions(address="auto"),
        )
    """
    if config.documents:
        raise ConfigError(
            "--documents builds run locally for now (leave out --ray); the Ray builder "
            "writes fixed-length token sequences"
        )
    options = ray or RayOptions()
    with ray_session(options) as ray_module:
        source = None
        if dataset is not None:
            source = text_source(ray_module, dataset, config, lineage)
        elif any(is_url(name) for name in config.inputs):
            source = text_url_source(ray_module, config)

        return build_on_pool(
            ray_module,
            config,
            options,
            lambda produce: run_text_build(config, produce, source),
            _drive,
        )


def _drive(job: TextJob, pool: WorkerPool) -> TextTotals:
    return _Run(job, pool).run()


@dataclass
class _Write:
    position: int
    ref: Any  # the worker's ShardInfo, or None: a shard a killed run stored (``info``)
    info: ShardInfo | None = None


class _Run:
    """One text build's driver loop (see the module doc)."""

    def __init__(self, job: TextJob, pool: WorkerPool) -> None:
        self.job = job
        self.pool = pool
        config = job.config
        self.cutter = StreamCutter(config.seq_len, job.samples_per_shard, job.start)
        self.window = 2 * len(pool)  # chunks tokenized ahead of the cutting
        self.tokenizing: dict[int, tuple[Any, Any, int]] = {}  # chunk -> count, tokens, actor
        self.tokens: dict[int, tuple[Any, int]] = {}  # counted chunks a shard still needs
        self.writes: deque[_Write] = deque()
        self.documents = job.documents
        self.reported = 0

    def run(self) -> TextTotals:
        job, config = self.job, self.job.config
        chunks = job.chunks
        next_submit = next_count = job.start.chunk
        while next_count < len(chunks):
            while next_submit < len(chunks) and next_submit - next_count < self.window:
                self._tokenize(next_submit)
                next_submit += 1
            if len(self.writes) >= self.window:  # bounds the tokens waiting in the store
                self._wait_head()
                continue
            count_ref = self.tokenizing[next_count][0]
            heads = [count_ref] + [w.ref for w in list(self.writes)[:1] if w.ref is not None]
            ready = self.pool.wait_any(heads)
            self._record_stored(ready)
            if count_ref in ready:
                self._count(next_count)
                next_count += 1
        last, dropped = self.cutter.finish()
        tokens = self.cutter.tokens_seen
        if not job.shards and not self.writes and last is None:
            raise too_little_input(config, job.source.names, self.documents, tokens)
        if last is not None:
            self._write(last, final_resume(job, tokens, self.documents, dropped))
        while self.writes:
            self._wait_head()
        return TextTotals(tokens, self.documents, dropped)

    def _tokenize(self, chunk: int) -> None:
        job, unit = self.job, self.job.chunks[chunk]
        if isinstance(unit, BlockChunk):  # a Ray Data block: passed by reference
            block = BlockTask(job.config.field, job.spec, job.dtype.name, unit.number, unit.nbytes)
            args: tuple[Any, ...] = (block, unit.ref)
            method = "tokenize_block"
        else:
            args, method = (
                (ChunkTask(unit, job.config.field, job.spec, job.dtype.name),),
                "tokenize",
            )
        actor = self.pool.least_busy()
        count, tokens = self.pool.submit(actor, method, *args, num_returns=2)
        self.tokenizing[chunk] = (count, tokens, actor)

    def _count(self, chunk: int) -> None:
        """Chunk ``chunk``'s count is in (all before it were): cut, start writes."""
        count_ref, tokens_ref, actor = self.tokenizing.pop(chunk)
        counted: TokenCount = self.pool.get(count_ref)
        self.tokens[chunk] = (tokens_ref, actor)
        for cut in self.cutter.add(chunk, counted.tokens):
            resume = {"stream": cut.position.to_dict(), "documents_before_chunk": self.documents}
            self._write(cut, resume)
        self.documents += counted.documents
        first = self.cutter.first_needed
        for done in [c for c in self.tokens if first is None or c < first]:
            del self.tokens[done]  # its tokens are in shards now: Ray frees them
        seq_len = self.job.config.seq_len
        sequences = (self.cutter.tokens_seen - self.job.start.tokens_before) // seq_len
        new, self.reported = sequences - self.reported, sequences
        self.job.progress.advance(
            self.job.chunks[chunk].nbytes,
            new,
            new * seq_len * self.job.dtype.itemsize,
            documents=counted.documents,
            tokens=counted.tokens,
        )

    def _write(self, cut: ShardCut, resume: dict[str, Any]) -> None:
        position = len(self.job.shards) + len(self.writes)
        if (stored := self.job.journal.reusable(position, resume)) is not None:
            self.writes.append(_Write(position, None, stored))  # a killed run stored it
            return
        chunks = tuple(dict.fromkeys(p.chunk for p in cut.pieces))
        # The actor holding the most tokens of the shard writes it: the least to move.
        sizes: dict[int, int] = {}
        for piece in cut.pieces:
            owner = self.tokens[piece.chunk][1]
            sizes[owner] = sizes.get(owner, 0) + piece.end - piece.start
        actor = max(sizes, key=sizes.__getitem__)
        config = self.job.config
        shard = TokenShard(position, cut.pieces, chunks, self.job.columns, config.seq_len, resume)
        ref = self.pool.submit(actor, "write_tokens", shard, *(self.tokens[c][0] for c in chunks))
        self.writes.append(_Write(position, ref))

    def _wait_head(self) -> None:
        """Wait for the shard at the head of the queue, then take what is stored."""
        head = self.writes[0].ref
        self._record_stored(set() if head is None else self.pool.wait_any([head]))

    def _record_stored(self, ready: set[Any]) -> None:
        """Take the stored (and journaled) shards at the head of the queue, in shard order."""
        while self.writes and (
            self.writes[0].ref is None
            or self.writes[0].ref in ready
            or self.pool.wait_any([self.writes[0].ref], timeout=0)
        ):
            write = self.writes.popleft()
            info = write.info if write.ref is None else self.pool.get(write.ref)
            assert info is not None and write.position == len(self.job.shards)
            self.job.shards.append(info)
            self.job.progress.count(shards=1, MB_written=info.stored.bytes / _MB)
