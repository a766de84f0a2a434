"""``build text --documents`` on a Ray cluster: the same shards, encoded and written by the workers.

The document kind of the builder's one pipeline (:class:`~..documents.DocumentKind`:
chunks, fingerprint, journal, resume, index), its ordered workers on actors
(:mod:`.driver`), as for text (:mod:`.text`):

1. actors read, tokenize and encode chunks (a window of them ahead) with the local
   builder's :func:`~..documents.encode_documents`; each chunk's samples (one per
   document, with its loss mask for chat/SFT records) stay in the object store of the
   actor's node, the driver gets each document's size and tokens;
2. taking them in chunk order, the driver cuts shards with the local builder's own cut
   (:meth:`DocumentKind.cut`: greedy by size), so boundaries depend on the input order only;
3. each shard is written and uploaded by the actor holding most of its documents, which
   journals it before putting it in place: a re-run after a kill continues after the last
   shard of the unbroken run and takes every later shard it finds recorded as it is.
"""

from __future__ import annotations

from typing import Any

from shardstream.shard_builder.cluster.driver import ActorDriver
from shardstream.shard_builder.cluster.pool import WorkerPool
from shardstream.shard_builder.cluster.worker import SampleShard
from shardstream.shard_builder.documents import DocumentKind, DocumentShard, DocumentSizes
from shardstream.shard_builder.pipeline import BuildRun


def drive_documents(kind: DocumentKind, run: BuildRun, pool: WorkerPool) -> None:
    """Make the shards of a document build on ``pool``'s actors."""
    _DocumentDriver(kind, run, pool).drive()


class _DocumentDriver(ActorDriver):
    """Documents on actors: they encode chunks; the driver cuts from the sizes."""

    def __init__(self, kind: DocumentKind, run: BuildRun, pool: WorkerPool) -> None:
        super().__init__(run, pool, len(kind.units))
        self.kind = kind

    def call(self, number: int) -> tuple[str, tuple[Any, ...]]:
        return "encode_documents", (self.kind.task(number, self.kind.units[number]),)

    def counted(self, number: int, count: DocumentSizes) -> None:
        kind = self.kind
        skip, tokens_before = kind.skip(number), kind.tokens
        for shard in kind.cut(number, count):
            self._write(shard)
        self.release(kind.needed)  # every document of the others is in a shard
        tokens = kind.tokens - tokens_before
        self.run.progress.advance(
            kind.units[number].nbytes,
            count.documents - skip,
            tokens * kind.dtype.itemsize,
            documents=count.documents - skip,
            tokens=tokens,
        )

    def finish(self) -> None:
        if (last := self.kind.cut_last()) is not None:
            self._write(last)

    def _write(self, shard: DocumentShard) -> None:
        shares = {chunk: end - start for chunk, start, end in shard.ranges}
        ranges = tuple((start, end) for _, start, end in shard.ranges)
        job = SampleShard(self.next_position, ranges, self.kind.columns, shard.resume)
        self.write(shard.resume, shares, "write_samples", job)
