"""A kind's shard cut, stated once: the local build and the Ray driver both apply it.

A kind that cuts (:class:`CutKind`) decides where its shards begin and end from each unit's
*count* alone (token counts, sample sizes), never from the samples themselves. That is what
lets a Ray build keep the samples on the workers: the driver sees only counts, yet cuts
exactly where the local build cuts, so the two write the same bytes. The pieces:

* a worker's step returns a :class:`UnitResult`: its :meth:`~UnitResult.count` (what the
  cut needs, small: it travels to the Ray driver) and its :attr:`~UnitResult.payload`
  (what shards take pieces of: a token array or a list of encoded samples; it stays where
  it was made);
* :meth:`CutKind.cut` takes the counts in unit order and returns the shards they close
  (:class:`CutShard`: pieces of the units' payloads and the journal record a resume starts
  from), with what the unit adds to the progress bar (:class:`Counted`);
  :meth:`CutKind.cut_last` closes the last shard;
* :class:`ShardLayout` turns a shard's pieces into the codec's input and writes the file,
  the same way in this process and on a Ray actor.

:class:`CutKind` implements the pipeline's local encoder (:meth:`~CutKind.add`,
:meth:`~CutKind.finish`) from the cut; :mod:`.cluster.driver` is the one Ray driver over
the same cut.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shardstream.mds import ShardInfo, write_shard, write_shard_arrays
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.packing import Piece, gather
from shardstream.shard_builder.pipeline import BuildKind, BuildRun

__all__ = ["Counted", "CutKind", "CutShard", "ShardLayout", "UnitResult"]


class UnitResult(Protocol):
    """What a cutting kind's worker step returns for one unit (a process or a Ray actor)."""

    @property
    def items(self) -> int:
        """Input items the unit held (documents, images): a worker's statistics."""

    @property
    def payload(self) -> Any:
        """What shards take pieces of (a token array, or a list of encoded samples)."""

    def count(self) -> Any:
        """What :meth:`CutKind.cut` needs of the unit (small: a Ray driver gets only this)."""


@dataclass(frozen=True)
class CutShard:
    """A shard the cut closed: pieces of the units' payloads, in order (``Piece.chunk`` is
    the unit), and its journal record (where the input stands after it)."""

    pieces: tuple[Piece, ...]
    resume: dict[str, Any]

    @property
    def shares(self) -> dict[int, int]:
        """Each unit the shard takes of, in order, and how much it takes."""
        shares: dict[int, int] = {}
        for piece in self.pieces:
            shares[piece.chunk] = shares.get(piece.chunk, 0) + piece.end - piece.start
        return shares


@dataclass(frozen=True)
class Counted:
    """What one unit's count did: the shards it closed, in order, and what it adds to the
    progress bar (``samples`` of ``out_bytes``; ``counts``: the named counters a Ray build
    shows)."""

    shards: list[CutShard]
    samples: int
    out_bytes: int
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardLayout:
    """How a shard's pieces become a shard file: ``columns``, and ``seq_len`` for rows of
    fixed-length tokens (payloads are token arrays, written whole by the codec's
    ``write_shard_arrays``), or ``None`` for encoded samples (payloads are lists of them,
    written by ``write_shard``)."""

    columns: dict[str, str]
    seq_len: int | None = None

    def data(self, pieces: tuple[Piece, ...], payloads: Mapping[int, Any]) -> Any:
        """The codec's input for ``pieces`` of ``payloads`` (unit -> payload)."""
        if self.seq_len is None:
            return [s for p in pieces for s in payloads[p.chunk][p.start : p.end]]
        (column,) = self.columns
        block = np.ascontiguousarray(gather(pieces, payloads))
        return {column: block.reshape(-1, self.seq_len)}

    def write(self, folder: Path, key: str, data: Any, options: OutputOptions) -> ShardInfo:
        """Write ``data`` (see :meth:`data`) as shard ``key`` in ``folder``, in the format
        ``options`` say (a Ray worker's write; a local build's goes through
        :meth:`store`)."""
        codec = write_shard if self.seq_len is None else write_shard_arrays
        return codec(folder, key, self.columns, data, fmt=options.shard_format())

    def store(self, run: BuildRun, resume: dict[str, Any], data: Any) -> ShardInfo:
        """:meth:`BuildRun.store` ``data`` as the next shard of ``run``."""
        if self.seq_len is None:
            return run.store_samples(resume, self.columns, data)
        return run.store_arrays(resume, self.columns, data)


class CutKind(BuildKind):
    """A kind whose shard boundaries follow from its units' counts alone (see the module
    doc): it states :meth:`cut`, :meth:`cut_last`, :meth:`needed` and :attr:`layout`, its
    worker step (:attr:`~BuildKind.work`) returns a :class:`UnitResult`, and the local
    encoder (:meth:`add`, :meth:`finish`) and the Ray driver follow."""

    #: How the kind's shards are written (set by the kind once its columns are known).
    layout: ShardLayout

    def __init__(self, config: OutputOptions) -> None:
        super().__init__(config)
        self._held: dict[int, Any] = {}  # unit -> its payload, while a shard needs it

    @abstractmethod
    def cut(self, number: int, count: Any) -> Counted:
        """Unit ``number``'s count (all before it were cut): the shards it closes and its
        progress. Keeps the counters that end in ``shardstream.json``."""

    @abstractmethod
    def cut_last(self) -> CutShard | None:
        """After the last unit: the last shard (its record says ``"final": True``), if any."""

    @abstractmethod
    def needed(self, number: int) -> bool:
        """Whether a shard not closed yet takes of unit ``number``'s payload (after
        :meth:`cut` of it): a unit no shard needs is let go."""

    def add(self, run: BuildRun, number: int, result: UnitResult) -> tuple[int, int]:
        held = self._held
        held[number] = result.payload
        counted = self.cut(number, result.count())
        for shard in counted.shards:
            self.layout.store(run, shard.resume, self.layout.data(shard.pieces, held))
        for unit in [u for u in held if not self.needed(u)]:
            del held[unit]
        return counted.samples, counted.out_bytes

    def finish(self, run: BuildRun) -> None:
        if (last := self.cut_last()) is not None:
            self.layout.store(run, last.resume, self.layout.data(last.pieces, self._held))
