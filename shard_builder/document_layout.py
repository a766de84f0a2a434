"""The documents layout: the columns of a dataset of whole documents, whoever writes it.

``build text --documents`` (:mod:`.documents`), ``import hf --documents``
(:mod:`.importers.hf_documents`) and ``import litdata --documents`` store each document as
one sample: its token ids in one variable-length array (MDS ``ndarray:<uint16|uint32>``),
and where the source says where the loss is taken, a ``loss_mask`` of one uint8 per token.
The dataset's metadata says ``"layout": "documents"``. Readers pack such samples into rows
at read time (``PackOptions``, whose ``column`` and ``mask_column`` default to these names).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream.shard_builder.config import MASK_COLUMN

__all__ = ["TOKENS_COLUMN", "document_layout"]

TOKENS_COLUMN = "tokens"
"""The token column's name unless a build names another (``TextBuildConfig.column``)."""


def document_layout(column: str, dtype: np.dtype[Any], *, masked: bool) -> dict[str, str]:
    """Column -> MDS encoding of a documents dataset: ``column`` holds each document's
    ``dtype`` ids (variable length), and with ``masked`` the ``loss_mask`` column one uint8
    per token."""
    columns = {column: f"ndarray:{dtype.name}"}
    if masked:
        columns[MASK_COLUMN] = "ndarray:uint8"
    return columns
