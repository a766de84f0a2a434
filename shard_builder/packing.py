"""Cutting the token stream into fixed-length sequences, a shard's worth at a time.

The stream is every document's tokens followed by EOS, in input order. The packer takes
it chunk by chunk (as the workers deliver chunks, in order) and hands out blocks of
``samples_per_shard`` sequences; only the final remainder shorter than ``seq_len`` is
dropped. With each block it reports where the stream stood right after it (chunk number
and tokens of that chunk already used), which is all a resumed build needs to continue.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


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


class TokenPacker:
    """Turns chunks of tokens into ``(samples_per_shard, seq_len)`` blocks plus a final one."""

    def __init__(
        self, seq_len: int, samples_per_shard: int, dtype: np.dtype[Any], start: StreamPosition
    ) -> None:
        self._seq_len = seq_len
        self._shard_tokens = seq_len * samples_per_shard
        self._dtype = dtype
        self._start = start
        self._parts: list[npt.NDArray[Any]] = []
        self._buffered = 0
        self._consumed = start.tokens_before  # stream tokens seen, the skipped prefix included

    @property
    def tokens_seen(self) -> int:
        """Stream tokens up to the end of the last chunk added (resumed prefix included)."""
        return self._consumed

    def add(
        self, chunk: int, tokens: npt.NDArray[Any]
    ) -> Iterator[tuple[npt.NDArray[Any], StreamPosition]]:
        """Add chunk ``chunk``'s tokens; yield every full shard block now available."""
        skip = self._start.skip if chunk == self._start.chunk else 0
        tokens = tokens[skip:].astype(self._dtype, copy=False)
        old = self._buffered
        chunk_start = self._consumed  # stream position of tokens[0]
        self._parts.append(tokens)
        self._buffered += len(tokens)
        self._consumed += len(tokens)
        if self._buffered < self._shard_tokens:
            return
        stream = np.concatenate(self._parts)
        count = len(stream) // self._shard_tokens
        for j in range(count):
            block = stream[j * self._shard_tokens : (j + 1) * self._shard_tokens]
            used = (j + 1) * self._shard_tokens - old  # tokens of this chunk in blocks so far
            pos = StreamPosition(chunk, skip + used, chunk_start + used)
            yield block.reshape(-1, self._seq_len), pos
        rest = stream[count * self._shard_tokens :]
        self._parts = [rest] if len(rest) else []
        self._buffered = len(rest)

    def finish(self) -> tuple[npt.NDArray[Any], int]:
        """The last block (whole sequences left, maybe none) and the tokens dropped."""
        stream = np.concatenate(self._parts) if self._parts else np.empty(0, self._dtype)
        whole = len(stream) - len(stream) % self._seq_len
        self._parts, self._buffered = [], 0
        return stream[:whole].reshape(-1, self._seq_len), len(stream) - whole
