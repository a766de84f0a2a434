"""What read-time packing refuses: options the data cannot hold and masks that are no masks.

A packed batch is int32 positions over the token column's dtype, so the options are
checked against both before anything is allocated (``seq_len=2**40`` would otherwise ask
for terabytes, ``pad_id=70000`` would overflow ``uint16`` tokens): each is one
:class:`ConfigError` naming the bound. A loss mask is trusted to line up with its
document token for token; one that does not would shift the masks of every later
document of its group without a word, so a mask of another length, or with values other
than 0 and 1, is a :class:`CorruptShardError` naming the sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shardstream.client.options import MAX_PACKED_POSITIONS, PackOptions
from shardstream.errors import ConfigError, CorruptShardError

__all__ = [
    "MASK_DTYPES",
    "check_documents",
    "check_mask_encoding",
    "check_positions",
    "check_token_dtype",
    "encoded_dtype",
]

MASK_DTYPES = ("uint8", "int8", "bool")
"""The dtypes a loss mask column may have (its values 0 and 1)."""
_MASK_CHARS = frozenset(np.dtype(name).char for name in MASK_DTYPES)

Where = Callable[[int], str]
"""Names the batch's ``i``-th document (its sample, and shard when known) for an error."""


def encoded_dtype(encoding: str) -> np.dtype[Any] | None:
    """The dtype an ``ndarray[:dtype[:shape]]`` encoding names (None: it names none)."""
    parts = encoding.split(":")
    try:
        return np.dtype(parts[1]) if len(parts) > 1 and parts[1] else None
    except TypeError:
        return None


def check_mask_encoding(name: str, encoding: str) -> None:
    """A mask column must hold arrays of :data:`MASK_DTYPES` (its values are checked per
    batch)."""
    dtype = encoded_dtype(encoding)
    if not encoding.startswith("ndarray") or (dtype is not None and dtype.name not in MASK_DTYPES):
        raise ConfigError(
            f"PackOptions.mask_column {name!r} is {encoding!r}, not a loss mask: a mask column "
            f"holds one 0/1 value per token ({', '.join(MASK_DTYPES)}); name the dataset's mask "
            "column, or mask_column=None"
        )


def check_token_dtype(options: PackOptions, dtype: np.dtype[Any], column: str) -> None:
    """``pad_id`` and ``eos_id`` must be values of the token column's integer ``dtype``."""
    if dtype.kind not in "iu":
        return
    top = int(np.iinfo(dtype).max)
    for name in ("pad_id", "eos_id"):
        value = getattr(options, name)
        if value is not None and value > top:
            raise ConfigError(
                f"PackOptions.{name}={value} does not fit the token column {column!r} "
                f"({dtype.name}: at most {top}); use a token id of the dataset's vocabulary"
            )


def check_positions(rows: int, seq_len: int, why: str) -> None:
    """A packed batch of ``rows`` rows of ``seq_len`` must fit int32 positions."""
    if rows * seq_len > MAX_PACKED_POSITIONS:
        raise ConfigError(
            f"a packed batch of {rows} rows x seq_len {seq_len} = {rows * seq_len:,} positions "
            f"is more than {MAX_PACKED_POSITIONS:,} (2**31 - 1: position_ids and cu_seqlens "
            f"are int32); {why}"
        )


def check_documents(
    docs: Sequence[npt.NDArray[Any]],
    masks: Sequence[npt.NDArray[Any]] | None,
    *,
    column: str,
    mask_column: str | None,
    where: Where,
) -> None:
    """Every mask has one 0/1 value per token of its document (see module doc)."""
    if masks is None:
        return
    for i, (doc, mask) in enumerate(zip(docs, masks, strict=True)):
        if len(mask) != len(doc):
            raise CorruptShardError(
                f"{where(i)}: its loss mask {mask_column!r} has {len(mask)} values for "
                f"{len(doc)} tokens of {column!r}; a mask holds one value per token (rebuild "
                "the dataset, or pack without the mask: mask_column=None)"
            )
    odd = {mask.dtype.char for mask in masks} - _MASK_CHARS  # (dtype.name costs 25 us)
    if odd:
        names = ", ".join(sorted(np.dtype(c).name for c in odd))
        raise ConfigError(
            f"PackOptions.mask_column {mask_column!r} holds {names} values, not a loss mask "
            f"({', '.join(MASK_DTYPES)}); name the dataset's mask column, or mask_column=None"
        )
    flat = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
    if flat.dtype.kind == "b" or not len(flat) or (flat.min() >= 0 and flat.max() <= 1):
        return  # the values of the whole batch at once; the culprit is looked for only now
    for i, mask in enumerate(masks):
        wrong = mask[(mask < 0) | (mask > 1)]
        if len(wrong):
            raise CorruptShardError(
                f"{where(i)}: its loss mask {mask_column!r} holds {int(wrong[0])}; a mask's "
                "values are 0 and 1"
            )
