"""Packing variable-length documents into fixed-length rows: the pure algorithm.

Arrays in, arrays out; no I/O and no randomness, so the same documents always give the
same rows. :mod:`~shardstream.client.batches.packed` applies it to the batches a reader builds, one
*group* of consecutive epoch positions at a time (see docs/plan.md, "Packing").

A document longer than ``seq_len`` is first cut into pieces of ``seq_len`` tokens (the
last piece shorter); each piece is a *segment* of one row. Pieces are then placed in
document order:

* ``"greedy"`` (next-fit): into the row being filled if it fits, else a new row is opened
  (the rest of the old row is padding); what Megatron-style and LanceDB-style packers do
  without splitting documents.
* ``"first_fit"``: into the first row with room for it, else a new row; fills the holes
  greedy leaves, so it pads less (Grain's first-fit packer, without its bin window).

With a fixed number of ``rows`` a piece that finds no row and may not open one puts what
fits into the row with the most room left (greedy: the last row) and the rest of its
document is *truncated* (a document keeps a prefix): counted, never silently lost. With
``rows=None`` as many rows are opened as the documents need and nothing is truncated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["METHODS", "Layout", "PackMethod", "fill", "pack_lengths"]

PackMethod = Literal["greedy", "first_fit"]
METHODS: tuple[str, ...] = ("greedy", "first_fit")

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Layout:
    """Where every segment goes. Segment ``k`` is tokens ``[start[k], start[k] +
    length[k])`` of document ``doc[k]``, placed at ``row[k]``, columns ``[offset[k],
    offset[k] + length[k])``. Segments are listed by row, then by offset."""

    rows: int
    seq_len: int
    doc: IntArray
    start: IntArray
    length: IntArray
    row: IntArray
    offset: IntArray
    truncated: int
    """Tokens of the documents that no row holds."""

    def same(self, other: Layout) -> bool:
        """Whether ``other`` places every segment in the same place."""
        return (self.rows, self.seq_len, self.truncated) == (
            other.rows,
            other.seq_len,
            other.truncated,
        ) and all(
            np.array_equal(getattr(self, k), getattr(other, k))
            for k in ("doc", "start", "length", "row", "offset")
        )

    @property
    def tokens(self) -> int:
        """Tokens placed."""
        return int(self.length.sum())

    @property
    def padding(self) -> int:
        """Row positions holding no token."""
        return self.rows * self.seq_len - self.tokens


def pack_lengths(
    lengths: Sequence[int] | IntArray,
    seq_len: int,
    *,
    rows: int | None = None,
    method: str = "first_fit",
) -> Layout:
    """The :class:`Layout` of documents of ``lengths`` tokens (in order) in rows of
    ``seq_len`` (see module doc). Pure and deterministic."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if rows is not None and rows < 1:
        raise ValueError(f"rows must be >= 1 or None, got {rows}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    limit = rows if rows is not None else None
    free: list[int] = []  # room left in each open row
    fills: list[list[tuple[int, int, int, int]]] = []  # per row: (doc, start, length, offset)
    truncated = 0
    for doc, total in enumerate(int(n) for n in lengths):
        if total < 0:
            raise ValueError(f"document {doc} has a negative length {total}")
        for start in range(0, total, seq_len):
            piece = min(seq_len, total - start)
            row = _row_for(free, piece, method)
            if row < 0 and (limit is None or len(free) < limit):
                free.append(seq_len)
                fills.append([])
                row = len(free) - 1
            take = piece
            if row < 0:  # no room and no new row: what fits goes in, the rest is cut
                row = len(free) - 1 if method == "greedy" else int(np.argmax(free))
                take = free[row]
                truncated += total - start - take  # a document keeps a prefix only
            if take:
                fills[row].append((doc, start, take, seq_len - free[row]))
                free[row] -= take
            if take < piece:
                break
    if rows is not None:  # a fixed shape: rows nothing reached are all padding
        fills.extend([] for _ in range(rows - len(fills)))
    flat = [(r, *seg) for r, segs in enumerate(fills) for seg in segs]
    cols = np.array(flat, dtype=np.int64).reshape(-1, 5).T
    return Layout(
        rows=len(fills),
        seq_len=seq_len,
        doc=cols[1].copy(),
        start=cols[2].copy(),
        length=cols[3].copy(),
        row=cols[0].copy(),
        offset=cols[4].copy(),
        truncated=truncated,
    )


def _row_for(free: list[int], piece: int, method: str) -> int:
    """The open row a piece of ``piece`` tokens goes into, or -1 (open a new one)."""
    if not free:
        return -1
    if method == "greedy":
        return len(free) - 1 if free[-1] >= piece else -1
    for row, room in enumerate(free):
        if room >= piece:
            return row
    return -1


@dataclass(frozen=True, eq=False)
class Packed:
    """Packed rows: ``input_ids``, ``position_ids`` (restarting at 0 in every segment),
    ``doc_ids`` (the document's index among the packed ones, -1 on padding), ``cu_seqlens``
    (int32 boundaries of every segment and padding run of the flattened rows, for varlen
    attention kernels), ``loss_mask`` (uint8, 0 on padding) when masks were given."""

    input_ids: npt.NDArray[Any]
    position_ids: npt.NDArray[np.int32]
    doc_ids: npt.NDArray[np.int32]
    cu_seqlens: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8] | None


def fill(
    layout: Layout,
    docs: Sequence[npt.NDArray[Any]],
    *,
    pad_id: int,
    masks: Sequence[npt.NDArray[Any]] | None = None,
    dtype: np.dtype[Any] | None = None,
    doc_base: int = 0,
    out: dict[str, npt.NDArray[Any]] | None = None,
) -> Packed:
    """The rows of ``layout`` filled with the tokens of ``docs`` (and ``masks``).

    ``doc_base`` is added to the document indices in ``doc_ids`` (a group's first document
    in its batch). ``out`` may hold preallocated ``input_ids``, ``position_ids``,
    ``doc_ids`` and ``loss_mask`` arrays of shape ``(rows, seq_len)`` to fill in place.
    """
    shape = (layout.rows, layout.seq_len)
    dtype = dtype or (docs[0].dtype if len(docs) else np.dtype(np.int64))
    arrays = out or {}
    ids = arrays.get("input_ids", np.empty(shape, dtype))
    pos = arrays.get("position_ids", np.empty(shape, np.int32))
    did = arrays.get("doc_ids", np.empty(shape, np.int32))
    mask = None
    if masks is not None:
        mask = arrays.get("loss_mask", np.empty(shape, np.uint8))
        mask.fill(0)
    ids.fill(pad_id)
    pos.fill(0)
    did.fill(-1)
    ramp = np.arange(layout.seq_len, dtype=np.int32)
    bounds: list[int] = [0]
    last_row, row_end = -1, 0
    for d, s, n, r, o in zip(
        layout.doc.tolist(),
        layout.start.tolist(),
        layout.length.tolist(),
        layout.row.tolist(),
        layout.offset.tolist(),
        strict=True,
    ):
        if r != last_row:
            _close_rows(bounds, last_row, row_end, r, layout.seq_len)
            last_row, row_end = r, 0
        ids[r, o : o + n] = docs[d][s : s + n]
        pos[r, o : o + n] = ramp[:n]
        did[r, o : o + n] = doc_base + d
        if mask is not None and masks is not None:
            mask[r, o : o + n] = masks[d][s : s + n]
        bounds.append(r * layout.seq_len + o + n)
        row_end = o + n
    _close_rows(bounds, last_row, row_end, layout.rows, layout.seq_len)
    return Packed(ids, pos, did, np.asarray(bounds, dtype=np.int32), mask)


def _close_rows(bounds: list[int], row: int, used: int, next_row: int, seq_len: int) -> None:
    """Boundaries of the padding after ``used`` tokens of ``row`` and of the empty rows
    before ``next_row`` (each a padding run of its own)."""
    if row >= 0 and used < seq_len:
        bounds.append((row + 1) * seq_len)
    for empty in range(row + 1, next_row):
        bounds.append((empty + 1) * seq_len)
