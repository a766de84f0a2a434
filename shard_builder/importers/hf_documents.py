"""Hugging Face token datasets as documents (``shardstream import hf --documents``).

Each row's ``input_ids`` (one flat list of integer token ids) becomes one document: a
``tokens`` sample of ``ndarray:<uint16|uint32>``, with a ``loss_mask`` (``ndarray:uint8``)
where the rows carry one, the layout ``build text --documents`` and ``import litdata
--documents`` write (:mod:`~shardstream.shard_builder.document_layout`), for
readers that pack at read time (``PackOptions``). Optional columns of the same row, one
value per token:

* ``loss_mask``: 1 where the loss is taken, 0 where not (ints or bools);
* else ``labels``: the Hugging Face convention, ``input_ids`` with ``-100`` where no loss is
  taken; the mask is 1 wherever the label is not ``-100``. Any other label must be the
  token's own id: labels shifted by one position say nothing the mask can keep;
* ``attention_mask``: 0 on padding (rows padded to one length); the padding is left out
  (its ids and labels unchecked), and the row's 1s must be one run (left or right
  padding), since a document is one run.

Every other column is left out (the summary names them). Ids are checked against the vocab
(``vocab_size``: ids in ``[0, vocab_size)``, stored as uint16 when it is at most 65,536;
without it, any id a uint32 holds). Each record batch is converted with a few numpy calls
over its flattened lists (their Arrow buffers), not per row; a bad value is one
:class:`InputError` naming the file, the row and the column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.errors import InputError
from shardstream.shard_builder.config import MASK_COLUMN
from shardstream.shard_builder.document_layout import TOKENS_COLUMN as TOKENS
from shardstream.shard_builder.document_layout import document_layout
from shardstream.shard_builder.importers.arrow_buffers import numbers
from shardstream.shard_builder.importers.source import Batch
from shardstream.shard_builder.tokenize import token_dtype

IDS = "input_ids"
LABELS = "labels"
ATTENTION = "attention_mask"
IGNORE_LABEL = -100  # Hugging Face's "no loss here" label
_MARK = "documents"  # in the format's option string: "<split>|documents|<vocab size>"


@dataclass(frozen=True)
class HfOption:
    """What ``import hf`` reads: a DatasetDict's ``split``, and with ``documents`` each
    row's ``input_ids`` as one document with ids below ``vocab_size`` (``None``: any
    uint32). It travels as the units' option string (:meth:`encode`, :meth:`parse`)."""

    split: str = ""
    documents: bool = False
    vocab_size: int | None = None

    def encode(self) -> str:
        if not self.documents:
            return self.split
        return f"{self.split}|{_MARK}|{self.vocab_size or ''}"

    @classmethod
    def parse(cls, option: str) -> HfOption:
        # Split names are \w+(\.\w+)* in datasets: no "|" in them.
        split, *rest = option.split("|")
        if not rest:
            return cls(split)
        vocab = rest[1] if len(rest) > 1 else ""
        return cls(split, True, int(vocab) if vocab else None)

    @property
    def dtype(self) -> np.dtype[Any]:
        """The stored id type: the vocab's, else uint32."""
        return token_dtype(self.vocab_size) if self.vocab_size else np.dtype(np.uint32)

    @property
    def id_limit(self) -> int:
        """One past the largest id allowed."""
        return self.vocab_size or 1 << 32


def mask_source(names: list[str]) -> str | None:
    """The column the loss mask comes from: ``loss_mask``, else ``labels``, else none."""
    return next((n for n in (MASK_COLUMN, LABELS) if n in names), None)


def notes(names: list[str], option: HfOption) -> list[str]:
    """What a documents import takes from a file with columns ``names`` (for the summary)."""
    source = mask_source(names)
    used = [IDS, *([source] if source else []), *([ATTENTION] if ATTENTION in names else [])]
    left = [n for n in names if n not in used]
    parts = [f"{TOKENS} ({option.dtype.name}) from {IDS}"]
    if source == LABELS:
        parts.append(f"{MASK_COLUMN} from {LABELS} (0 where {IGNORE_LABEL})")
    elif source:
        parts.append(f"{MASK_COLUMN} from {MASK_COLUMN}")
    if ATTENTION in names:
        parts.append(f"padding ({ATTENTION} 0) left out")
    if left:
        parts.append(f"columns left out: {', '.join(left)}")
    return ["documents: " + "; ".join(parts)]


@dataclass(frozen=True)
class _Lists:
    """A list column of a record batch, flattened: ``values[offsets[r]:offsets[r + 1]]``
    are row ``r``'s values (``offsets`` from 0)."""

    name: str
    values: npt.NDArray[Any]
    offsets: npt.NDArray[np.int64]


def document_batch(path: str, first: int, batch: Any, option: HfOption) -> Batch:
    """The documents of a record batch whose first row is row ``first`` of ``path``."""
    names = list(batch.schema.names)
    where = _Where(path, first)
    if IDS not in names:
        raise InputError(
            f"{path}: no column {IDS!r} (its columns: {', '.join(names)}); --documents takes "
            f"each row's token ids from {IDS} (rename the column with "
            "datasets' rename_column, or tokenize first)"
        )
    ids = _lists(where, batch, IDS)
    keep = None  # the tokens that are no padding (None: all)
    if ATTENTION in names:
        attend = _same_shape(where, ids, _lists(where, batch, ATTENTION))
        _check_range(where, attend, 2, "not 0 or 1")
        keep = _one_run(where, attend)
    vocab = option.vocab_size
    outside = f"outside the vocabulary [0, {vocab})" if vocab else "not a uint32 token id"
    _check_range(where, ids, option.id_limit, outside, keep)  # padding ids may be anything
    source = mask_source(names)
    mask: npt.NDArray[np.uint8] | None = None
    if source == LABELS:
        labels = _same_shape(where, ids, _lists(where, batch, LABELS))
        mask = _labels_mask(where, ids, labels, keep)
    elif source is not None:
        values = _same_shape(where, ids, _lists(where, batch, source))
        _check_range(where, values, 2, "not 0 or 1")
        mask = values.values.astype(np.uint8)
    tokens, offsets = ids.values, ids.offsets
    if keep is not None:
        tokens, mask = tokens[keep], None if mask is None else mask[keep]
        offsets = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))[offsets]
    cuts = offsets[1:-1]
    columns: dict[str, tuple[str, Any]] = {}
    layout = document_layout(TOKENS, option.dtype, masked=mask is not None)
    columns[TOKENS] = (layout[TOKENS], np.split(tokens.astype(option.dtype), cuts))
    if mask is not None:
        columns[MASK_COLUMN] = (layout[MASK_COLUMN], np.split(mask, cuts))
    return Batch(batch.num_rows, where, columns)


@dataclass(frozen=True)
class _Where:
    """Names row ``i`` of a batch whose first row is ``first`` of ``path``."""

    path: str
    first: int

    def __call__(self, i: int) -> str:
        return f"{self.path} row {self.first + i}"


def _lists(where: _Where, batch: Any, name: str) -> _Lists:
    """Column ``name`` of ``batch``, which must hold one flat list of integers per row."""
    import pyarrow as pa

    array = batch.column(name)
    t = array.type
    listed = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if not any(test(t) for test in listed):
        raise InputError(f"{where(0)}: column {name!r} is {t}, not a list of ids per row")
    inner = t.value_type
    if any(test(inner) for test in listed):
        raise InputError(
            f"{where(0)}: column {name!r} holds nested lists ({t}); --documents takes one "
            "flat list of token ids per row (flatten each row, or give each document a row)"
        )
    if not (pa.types.is_integer(inner) or pa.types.is_boolean(inner)):
        raise InputError(f"{where(0)}: column {name!r} is {t}, not a list of integers")
    if array.null_count:
        row = array.is_null().to_pylist().index(True)
        raise InputError(f"{where(row)}: column {name!r} is null")
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        offsets = (array.offset + np.arange(len(array) + 1, dtype=np.int64)) * size
    else:
        offsets = numbers(array.offsets).astype(np.int64)
    child = array.values
    lo, hi = int(offsets[0]), int(offsets[-1])
    values = child.slice(lo, hi - lo)
    if values.null_count:
        at = values.is_null().to_pylist().index(True)
        row = _row_of(offsets - lo, at)
        pos = at - int(offsets[row] - lo)
        raise InputError(f"{where(row)}: column {name!r} has a null at position {pos}")
    return _Lists(name, numbers(child)[lo:hi], offsets - lo)


def _row_of(offsets: npt.NDArray[np.int64], at: int) -> int:
    """The row whose values hold flat position ``at``."""
    return int(np.searchsorted(offsets, at, side="right")) - 1


def _first_bad(where: _Where, lists: _Lists, bad: npt.NDArray[np.bool_]) -> tuple[str, int, int]:
    """``(row name, position in the row, flat position)`` of the first true ``bad``."""
    at = int(bad.argmax())
    row = _row_of(lists.offsets, at)
    return where(row), at - int(lists.offsets[row]), at


def _check_range(
    where: _Where, lists: _Lists, hi: int, what: str, keep: npt.NDArray[np.bool_] | None = None
) -> None:
    """Every value (where ``keep``) in ``[0, hi)``, else an error naming the first one
    outside (``what``)."""
    v = lists.values
    if not v.size or (int(v.min()) >= 0 and int(v.max()) < hi):
        return
    bad = (v < 0) | (v >= hi)
    if keep is not None:
        bad &= keep
        if not bad.any():
            return
    row, pos, at = _first_bad(where, lists, bad)
    raise InputError(f"{row}: {lists.name}[{pos}] is {int(v[at])}, {what}")


def _same_shape(where: _Where, ids: _Lists, other: _Lists) -> _Lists:
    """``other``, which must hold as many values per row as ``ids``."""
    if not np.array_equal(ids.offsets, other.offsets):
        counts, other_counts = np.diff(ids.offsets), np.diff(other.offsets)
        row = int((counts != other_counts).argmax())
        raise InputError(
            f"{where(row)}: {other.name} has {int(other_counts[row])} values and {ids.name} "
            f"{int(counts[row])}; give one per token"
        )
    return other


def _labels_mask(
    where: _Where, ids: _Lists, labels: _Lists, keep: npt.NDArray[np.bool_] | None
) -> npt.NDArray[np.uint8]:
    """1 where a label is taken (not -100); every such label must be the token's id (off
    the padding, which is left out)."""
    taken = labels.values != IGNORE_LABEL
    differs = taken & (labels.values != ids.values)
    if keep is not None:
        differs &= keep
    if differs.any():
        row, pos, at = _first_bad(where, labels, differs)
        raise InputError(
            f"{row}: {LABELS}[{pos}] is {int(labels.values[at])} where {IDS}[{pos}] is "
            f"{int(ids.values[at])}; --documents takes {LABELS} as {IDS} with "
            f"{IGNORE_LABEL} where no loss is taken (labels shifted by one are no loss mask: "
            f"drop them, or give a {MASK_COLUMN} column)"
        )
    mask: npt.NDArray[np.uint8] = taken.astype(np.uint8)
    return mask


def _one_run(where: _Where, attend: _Lists) -> npt.NDArray[np.bool_]:
    """Where ``attention_mask`` is 1, which must be one run per row (padding at either end)."""
    keep = attend.values.astype(bool)
    before = np.concatenate(([False], keep[:-1]))
    starts_row = attend.offsets[:-1][np.diff(attend.offsets) > 0]
    before[starts_row] = False  # a row's first value has nothing before it
    starts = np.concatenate(([0], np.cumsum(keep & ~before, dtype=np.int64)))
    runs = starts[attend.offsets[1:]] - starts[attend.offsets[:-1]]
    if (runs > 1).any():
        row = int((runs > 1).argmax())
        raise InputError(
            f"{where(row)}: {ATTENTION} has {int(runs[row])} runs of 1s; a document is one run "
            "(padding only at its start or end)"
        )
    return keep
