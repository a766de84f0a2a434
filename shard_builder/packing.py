"""Where shards begin and end: the cutting arithmetic the builder's kinds state their cut with.

:class:`StreamCutter` cuts the token stream (every document's tokens followed by EOS, in
input order) into fixed-length sequences, a shard's worth at a time, from token counts
alone: it takes the stream chunk by chunk (as the workers deliver chunks, in order) and
hands out shards of ``samples_per_shard`` sequences; only the final remainder shorter than
``seq_len`` is dropped. With each shard it reports where the stream stood right after it
(chunk number and tokens of that chunk already used), which is all a resumed build needs to
continue. :class:`GreedyCut` packs samples of known sizes greedily into shards of a byte
budget (images, documents).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.mds import shard_config
from shardstream.shard_builder.config import OutputOptions


@dataclass(frozen=True)
class StreamPosition:
    """A point in the token stream: the next token is ``chunk``'s token number ``skip``."""

    chunk: int
    skip: int
    tokens_before: int  # tokens of the stream before this point (for the final counts)

    def to_dict(self) -> dict[str, int]:
        """JSON form stored in the journal."""
        return {"chunk": self.chunk, "skip": self.skip, "tokens_before": self.tokens_before}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> StreamPosition:
        """Inverse of :meth:`to_dict`."""
        return cls(int(obj["chunk"]), int(obj["skip"]), int(obj["tokens_before"]))


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, end)`` of chunk ``chunk``'s token array (the whole array, skip included)."""

    chunk: int
    start: int
    end: int


@dataclass(frozen=True)
class ShardCut:
    """One shard's tokens, as pieces of chunks in stream order, and the position after it."""

    pieces: tuple[Piece, ...]
    position: StreamPosition


class StreamCutter:
    """Where the shards of the token stream begin and end, from token counts alone.

    The one home of the text kind's cutting arithmetic (:class:`~.text.TextKind`): a local
    build applies its cuts to token arrays in this process, a Ray build to arrays that stay
    on the workers (the driver sees only each chunk's count). Feed chunks in order with
    :meth:`add`; a shard is ``samples_per_shard`` whole sequences, the last one
    (:meth:`finish`) what is left.
    """

    def __init__(self, seq_len: int, samples_per_shard: int, start: StreamPosition) -> None:
        self._seq_len = seq_len
        self._shard_tokens = seq_len * samples_per_shard
        self._start = start
        self._pieces: deque[Piece] = deque()
        self._buffered = 0
        self._consumed = start.tokens_before  # stream tokens seen, the skipped prefix included

    @property
    def tokens_seen(self) -> int:
        """Stream tokens up to the end of the last chunk added (resumed prefix included)."""
        return self._consumed

    @property
    def first_needed(self) -> int | None:
        """The lowest chunk whose tokens a future shard still needs (``None``: none buffered)."""
        return self._pieces[0].chunk if self._pieces else None

    def add(self, chunk: int, count: int) -> list[ShardCut]:
        """Chunk ``chunk`` holds ``count`` tokens: the shards it completes, in order."""
        skip = self._start.skip if chunk == self._start.chunk else 0
        chunk_start = self._consumed  # stream position of the chunk's token number ``skip``
        if count > skip:
            self._pieces.append(Piece(chunk, skip, count))
            self._buffered += count - skip
            self._consumed += count - skip
        cuts: list[ShardCut] = []
        while self._buffered >= self._shard_tokens:
            # Before this chunk fewer than a shard's tokens waited, so every shard cut here
            # ends inside this chunk: the position after it is a point in this chunk.
            pieces = self._take(self._shard_tokens)
            end = pieces[-1].end
            cuts.append(ShardCut(pieces, StreamPosition(chunk, end, chunk_start + end - skip)))
        return cuts

    def finish(self) -> tuple[ShardCut | None, int]:
        """The last shard (the whole sequences left; ``None`` if none) and the tokens dropped.

        The last shard's position is left at the end of the last piece; callers record
        the end of the stream instead.
        """
        whole = self._buffered - self._buffered % self._seq_len
        dropped = self._buffered - whole
        pieces = self._take(whole)
        self._pieces.clear()
        self._buffered = 0
        if not pieces:
            return None, dropped
        last = pieces[-1]
        return ShardCut(
            pieces, StreamPosition(last.chunk, last.end, self._consumed - dropped)
        ), dropped

    def _take(self, tokens: int) -> tuple[Piece, ...]:
        taken: list[Piece] = []
        while tokens:
            head = self._pieces[0]
            n = min(tokens, head.end - head.start)
            taken.append(Piece(head.chunk, head.start, head.start + n))
            if n == head.end - head.start:
                self._pieces.popleft()
            else:
                self._pieces[0] = Piece(head.chunk, head.start + n, head.end)
            tokens -= n
            self._buffered -= n
        return tuple(taken)


def gather(pieces: tuple[Piece, ...], arrays: Mapping[int, npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """The tokens of ``pieces``, one array (``arrays``: each chunk's token array)."""
    parts = [arrays[p.chunk][p.start : p.end] for p in pieces]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class GreedyCut:
    """Greedy packing of samples, in order, into shards of at most ``shard_size`` bytes.

    ``header`` is a shard's size before its samples; each sample costs its bytes plus a
    4-byte offset. The image and document kinds decide their shard boundaries here
    (:func:`greedy_cut`).
    """

    def __init__(self, header: int, shard_size: int) -> None:
        self._header = header
        self._limit = shard_size
        self._count = 0
        self._bytes = header

    def add(self, size: int) -> bool:
        """Add a sample of ``size`` bytes; ``True`` if a new shard starts with it."""
        new_shard = self._count > 0 and self._bytes + size + 4 > self._limit
        if new_shard:
            self.reset()
        self._count += 1
        self._bytes += size + 4
        return new_shard

    def reset(self) -> None:
        """Start an empty shard."""
        self._count, self._bytes = 0, self._header


def greedy_cut(columns: dict[str, str], options: OutputOptions) -> GreedyCut:
    """The greedy cut of shards of ``columns`` written as ``options`` say."""
    return GreedyCut(shard_header_bytes(columns, options), options.shard_size)


def shard_header_bytes(columns: dict[str, str], options: OutputOptions) -> int:
    """A shard's bytes before its samples: count, one offset more, config JSON."""
    template = shard_config(
        columns,
        compression=options.compression,
        hashes=options.hashes,
        size_limit=options.shard_size,
    )
    # Shard file = count + offsets (4 bytes per sample, plus one) + config JSON + samples.
    return 8 + len(json.dumps(template.config(), sort_keys=True))
