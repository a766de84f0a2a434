"""Which column holds a sample's tokens, and how many tokens a fixed-length sample has.

One rule, read by the client (a schedule whose phases end by tokens needs the tokens a
step consumes: :mod:`shardstream.client.batches.step_tokens`) and by the server (a run's
mixture in tokens: :mod:`shardstream.server.data.mixture_history`):

* the **token column** is the first of :data:`TOKEN_COLUMNS` a dataset has, fixed-length
  or not; without one, the dataset's only fixed-shape ``ndarray`` column (a dataset with
  several, and no column named for its tokens, has none: which would be a guess);
* a sample's **tokens** are the elements of one value of that column when its encoding
  fixes the shape (``ndarray:uint16:2048``, what ``build text`` writes: 2048;
  ``ndarray:uint32:4,512``: 2048). Documents of varying length (``ndarray:uint32``, what
  ``build text --documents`` writes) have no fixed count.

An encoding is judged by the codec's own parser, so a shape the codec would refuse
(a zero or negative dimension, a value over 4 GiB) is no fixed length either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shardstream.errors import UnsupportedEncodingError
from shardstream.mds._encodings import ndarray_spec

__all__ = ["TOKEN_COLUMNS", "fixed_shape", "token_column", "tokens_per_sample"]

TOKEN_COLUMNS = ("tokens", "input_ids")
"""Column names taken as the token column, in this order, before any other column."""


def fixed_shape(encoding: object) -> tuple[int, ...] | None:
    """The shape of one value of a fixed-shape ``ndarray:<dtype>:<d0,d1,...>`` encoding;
    ``None`` for any other encoding (scalars, varying arrays, malformed strings)."""
    if not isinstance(encoding, str) or not encoding.startswith("ndarray:"):
        return None
    try:
        return ndarray_spec(encoding)[1]
    except UnsupportedEncodingError:
        return None


def token_column(columns: Mapping[str, object]) -> str | None:
    """The column of ``columns`` (name -> MDS encoding) that holds a sample's tokens (see
    the module), or ``None`` where none does."""
    named = next((name for name in TOKEN_COLUMNS if name in columns), None)
    if named is not None:
        return named
    fixed = [name for name, encoding in columns.items() if fixed_shape(encoding) is not None]
    return str(fixed[0]) if len(fixed) == 1 else None


def tokens_per_sample(columns: object) -> int | None:
    """Tokens in one sample of a dataset with these ``columns`` (name -> MDS encoding): the
    elements of one value of its token column when that has a fixed shape; ``None`` for
    documents of varying length, no token column, or ``columns`` that are not a mapping
    (the server reads them from stored JSON)."""
    if not isinstance(columns, Mapping):
        return None
    name = token_column(columns)
    shape = None if name is None else fixed_shape(columns[name])
    return None if shape is None else math.prod(shape)
