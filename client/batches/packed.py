"""Read-time packing of a rank's batch of documents (:class:`PackOptions`).

A rank's batch holds ``batch_size`` consecutive positions of the epoch's global order
(its slice of the global batch), so its groups of ``group`` documents are groups of
consecutive *global* positions whenever ``group`` divides the per-rank batch size. Each
group is packed alone by :func:`~shardstream.client.batches.packing.pack_lengths`: the rows are a
function of the global order, whatever the world size or worker count, and the resume
state stays ``(epoch, batch)``. The packing parameters are part of the plan parameters
(:meth:`Packer.params`), so a resume with other packing is refused.

With a fixed number of ``rows``, what does not fit is truncated. It is never lost without
a word: each batch carries its ``truncated_tokens`` (per group), this process counts placed and
truncated tokens for the loader's input figures (:func:`process_pack_counts`, read like
the storage and cache counters), and a packer warns once
(:class:`PackingTruncationWarning`) when more than :data:`TRUNCATION_WARN_SHARE` of the
document tokens it has seen were cut, naming the rows the documents need.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.client.batches.batch import SAMPLE_ID, Allocator, ColumnSpec, numpy_allocator
from shardstream.client.batches.pack_checks import (
    check_documents,
    check_mask_encoding,
    check_positions,
    check_token_dtype,
    encoded_dtype,
)
from shardstream.client.batches.packing import Layout, fill, pack_lengths
from shardstream.client.options import PackOptions
from shardstream.errors import ConfigError, ResumeError

__all__ = [
    "PACKED_KEYS",
    "TRUNCATION_WARN_SHARE",
    "Packer",
    "PackingTruncationWarning",
    "process_pack_counts",
]

PACKED_KEYS = (
    "input_ids",
    "position_ids",
    "doc_ids",
    "cu_seqlens",
    "loss_mask",
    "truncated_tokens",
)

TRUNCATION_WARN_SHARE = 0.01
"""Share of the document tokens truncated past which a packer warns (once)."""


class PackingTruncationWarning(UserWarning):
    """Fixed-``rows`` packing is cutting more than :data:`TRUNCATION_WARN_SHARE` of the
    document tokens."""


class Packer:
    """Turns a rank's batch of documents into packed rows (see module doc)."""

    def __init__(self, options: PackOptions, spec: ColumnSpec, batch_size: int) -> None:
        if options.column not in spec.encodings:
            raise ConfigError(
                f"PackOptions.column {options.column!r} is not a column of the dataset "
                f"(columns: {sorted(spec.encodings)}); name the token column"
            )
        if not spec.encodings[options.column].startswith("ndarray"):
            raise ConfigError(
                f"PackOptions.column {options.column!r} is {spec.encodings[options.column]!r}; "
                "packing needs token arrays (ndarray), e.g. from `shardstream build text "
                "--documents`"
            )
        self.options = options
        self.mask = options.mask_column if options.mask_column in spec.encodings else None
        if self.mask is not None:
            check_mask_encoding(self.mask, spec.encodings[self.mask])
        self.batch_size = batch_size
        self.group = options.group or batch_size
        self._check_group(batch_size)
        token_dtype = encoded_dtype(spec.encodings[options.column])
        if token_dtype is not None:
            check_token_dtype(options, token_dtype, options.column)
        self._token_bytes = 8 if token_dtype is None else token_dtype.itemsize
        self._dtype_checked = token_dtype is not None
        self._seen = self._truncated = 0  # document tokens this packer saw, and cut
        self._warned = False

    def _check_group(self, batch_size: int) -> None:
        if batch_size % self.group:
            raise ConfigError(
                f"PackOptions.group {self.group} does not divide the per-rank batch size "
                f"{batch_size}: packing groups must not straddle ranks; choose a group that "
                "divides the batch size on every world size you may resume on"
            )
        rows = self.options.rows
        if rows is not None:
            check_positions(
                batch_size // self.group * rows,
                self.options.seq_len,
                f"PackOptions(rows={rows}) for each group of {self.group} of the "
                f"{batch_size} documents a rank's batch holds: lower seq_len or rows",
            )

    def params(self) -> dict[str, Any]:
        """What decides the packed rows, for the resume state's plan parameters."""
        o = self.options
        return {
            "seq_len": o.seq_len,
            "pad_id": o.pad_id,
            "eos_id": o.eos_id,
            "method": o.method,
            "rows": o.rows,
            "group": self.group,
            "column": o.column,
            "mask": self.mask,
        }

    def batch_bytes(self) -> int:
        """Room one packed rank batch takes in a loader's shared-memory slot: ``rows`` per
        group (``None``: one row per document, the most a group of documents no longer
        than ``seq_len`` needs), each ``seq_len`` of tokens, positions, doc ids and mask.
        A batch that needs more still works: its arrays travel pickled."""
        rows = (self.options.rows or self.group) * (self.batch_size // self.group)
        per_token = self._token_bytes + 4 + 4 + (1 if self.mask is not None else 0)
        groups = self.batch_size // self.group  # a truncated count each
        return rows * self.options.seq_len * per_token + 8 * groups + 64 * len(PACKED_KEYS)

    def adopt(self, saved: Mapping[str, Any] | None) -> None:
        """A resume keeps the saved group unless the user fixed one (the default group is
        the first run's per-rank batch size, which another world size changes)."""
        if saved is None or self.options.group is not None:
            return
        group = saved.get("group")
        if isinstance(group, int) and group != self.group:
            self.group = group
            try:
                self._check_group(self.batch_size)
            except ConfigError as exc:
                raise ResumeError(f"cannot resume with this world size: {exc}") from None

    def apply(
        self,
        batch: Mapping[str, Any],
        alloc: Allocator = numpy_allocator,
        where: Callable[[int], str] | None = None,
    ) -> dict[str, Any]:
        """The packed columns of one rank batch (``sample_id`` kept when present).

        ``where(i)`` names the batch's ``i``-th document in an error (default: its
        ``sample_id`` when the batch has one, else its place in the batch)."""
        docs = _documents(batch[self.options.column])
        masks = _documents(batch[self.mask]) if self.mask is not None else None
        check_documents(
            docs,
            masks,
            column=self.options.column,
            mask_column=self.mask,
            where=where or _default_where(batch),
        )
        if docs and not self._dtype_checked:  # the encoding named no dtype: check the data's
            check_token_dtype(self.options, docs[0].dtype, self.options.column)
        eos = self.options.eos_id
        if eos is not None:
            docs, masks = _with_eos(docs, masks, eos)
        seq_len, dtype = self.options.seq_len, _token_dtype(docs)
        layouts = []
        for first in range(0, len(docs), self.group):
            lengths = [len(d) for d in docs[first : first + self.group]]
            layouts.append(
                pack_lengths(lengths, seq_len, rows=self.options.rows, method=self.options.method)
            )
        total = sum(layout.rows for layout in layouts)
        check_positions(
            total,
            seq_len,
            "the batch's documents need that many rows with PackOptions(rows=None): lower "
            "seq_len, or fix rows",
        )
        shape = (total, seq_len)
        out: dict[str, Any] = {
            "input_ids": alloc("input_ids", shape, dtype),
            "position_ids": alloc("position_ids", shape, np.dtype(np.int32)),
            "doc_ids": alloc("doc_ids", shape, np.dtype(np.int32)),
        }
        if masks is not None:
            out["loss_mask"] = alloc("loss_mask", shape, np.dtype(np.uint8))
        bounds = [np.zeros(1, np.int32)]
        row = 0
        for g, layout in enumerate(layouts):
            first = g * self.group
            part = {k: v[row : row + layout.rows] for k, v in out.items()}
            packed = fill(
                layout,
                docs[first : first + self.group],
                pad_id=self.options.pad_id,
                masks=None if masks is None else masks[first : first + self.group],
                dtype=dtype,
                out=part,
            )
            bounds.append(packed.cu_seqlens[1:] + row * seq_len)
            row += layout.rows
        out["cu_seqlens"] = np.concatenate(bounds)
        # Per group, so the ranks' arrays of a step concatenate to the same global array
        # on every world size (as the rows do).
        truncated = alloc("truncated_tokens", (len(layouts),), np.dtype(np.int64))
        truncated[:] = [layout.truncated for layout in layouts]
        out["truncated_tokens"] = truncated
        self._count(layouts, docs)
        if SAMPLE_ID in batch:
            out[SAMPLE_ID] = batch[SAMPLE_ID]
        return out

    def _count(self, layouts: list[Layout], docs: list[npt.NDArray[Any]]) -> None:
        """Count the batch's placed and truncated tokens (this process's figures); warn
        once past :data:`TRUNCATION_WARN_SHARE`."""
        placed = sum(layout.tokens for layout in layouts)
        truncated = sum(layout.truncated for layout in layouts)
        _count_process(placed, truncated)
        self._seen += placed + truncated
        self._truncated += truncated
        if not self._warned and self._truncated > TRUNCATION_WARN_SHARE * self._seen:
            self._warned = True
            warnings.warn(self._truncation_message(docs), PackingTruncationWarning, stacklevel=2)

    def _truncation_message(self, docs: list[npt.NDArray[Any]]) -> str:
        o = self.options
        needed = max(
            pack_lengths(
                [len(d) for d in docs[first : first + self.group]], o.seq_len, method=o.method
            ).rows
            for first in range(0, len(docs), self.group)
        )
        return (
            f"read-time packing truncated {self._truncated:,} of {self._seen:,} document "
            f"tokens ({self._truncated / self._seen:.1%}): PackOptions(rows={o.rows}) holds "
            f"{o.rows} x {o.seq_len} tokens per group of {self.group} documents, and this "
            f"batch's groups need up to {needed} rows to hold every token. Raise rows (or "
            "lower group), or set rows=None to keep every token (the batch's row count then "
            "varies); truncated tokens are counted in batch['truncated_tokens'] and "
            "loader.stats()"
        )


def _default_where(batch: Mapping[str, Any]) -> Callable[[int], str]:
    ids = batch.get(SAMPLE_ID)

    def where(i: int) -> str:
        if ids is not None:
            return f"sample {int(ids[i])} (document {i} of the batch)"
        return f"document {i} of the batch"

    return where


_PROCESS_LOCK = threading.Lock()
_PROCESS_COUNTS = [0, 0]  # tokens placed and truncated by every packer of this process


def process_pack_counts() -> tuple[int, int]:
    """(tokens placed, tokens truncated) by read-time packing in this process since it
    started (or was forked): the loader's input figures take differences of it."""
    with _PROCESS_LOCK:
        return _PROCESS_COUNTS[0], _PROCESS_COUNTS[1]


def _count_process(placed: int, truncated: int) -> None:
    with _PROCESS_LOCK:
        _PROCESS_COUNTS[0] += placed
        _PROCESS_COUNTS[1] += truncated


def _reset_after_fork() -> None:
    global _PROCESS_LOCK  # noqa: PLW0603  (a lock held at the fork stays held in the child)
    _PROCESS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _documents(value: Any) -> list[npt.NDArray[Any]]:
    """A batch column of token arrays as a list of 1-D arrays (stacked when equal-sized)."""
    return [np.asarray(v).reshape(-1) for v in value]


def _token_dtype(docs: list[npt.NDArray[Any]]) -> np.dtype[Any]:
    return docs[0].dtype if docs else np.dtype(np.int64)


def _with_eos(
    docs: list[npt.NDArray[Any]], masks: list[npt.NDArray[Any]] | None, eos: int
) -> tuple[list[npt.NDArray[Any]], list[npt.NDArray[Any]] | None]:
    """Every document ending with ``eos`` (appended where missing; its mask copies the
    document's last mask value, so an SFT reply's EOS is trained)."""
    out_docs: list[npt.NDArray[Any]] = []
    out_masks: list[npt.NDArray[Any]] | None = [] if masks is not None else None
    for i, doc in enumerate(docs):
        if len(doc) and int(doc[-1]) == eos:
            out_docs.append(doc)
            if out_masks is not None and masks is not None:
                out_masks.append(masks[i])
            continue
        out_docs.append(np.append(doc, np.array([eos], dtype=doc.dtype)))
        if out_masks is not None and masks is not None:
            last = masks[i][-1:] if len(masks[i]) else np.ones(1, np.uint8)
            out_masks.append(np.append(masks[i], last))
    return out_docs, out_masks
