"""Which column holds a sample's tokens and how many a fixed-length sample has: one rule
(shardstream.mds) for the client's schedules in tokens and the server's mixture figures
(tests/client/batches/test_step_tokens.py checks the client agrees)."""

from __future__ import annotations

import pytest

from shardstream.mds import TOKEN_COLUMNS, fixed_shape, token_column, tokens_per_sample


@pytest.mark.parametrize(
    ("encoding", "shape"),
    [
        ("ndarray:uint16:2048", (2048,)),
        ("ndarray:uint32:4,512", (4, 512)),
        ("ndarray:uint16", None),  # documents: each value its own length
        ("ndarray", None),
        ("uint16", None),
        ("str", None),
        ("ndarray:uint16:x", None),
        ("ndarray:uint16:0", None),  # the codec refuses it, so no fixed length either
        ("ndarray:uint16:-4", None),
        ("ndarray:bfloat16:8", None),
        ("ndarray:uint8:8:8", None),
        ("ndarray:uint8:4294967296", None),  # one value over 4 GiB
        (2048, None),  # stored JSON may hold anything
    ],
)
def test_a_fixed_shape_is_what_the_codec_would_write(encoding: object, shape: object) -> None:
    assert fixed_shape(encoding) == shape


@pytest.mark.parametrize(
    ("columns", "name", "tokens"),
    [
        ({"tokens": "ndarray:uint16:2048"}, "tokens", 2048),
        ({"input_ids": "ndarray:uint32:4,512", "x": "int"}, "input_ids", 2048),
        ({"input_ids": "ndarray:uint32:8", "tokens": "ndarray:uint16:4"}, "tokens", 4),
        ({"ids": "ndarray:uint16:16", "text": "str"}, "ids", 16),  # the only fixed array
        ({"ids": "ndarray:uint16:16", "mask": "ndarray:uint8"}, "ids", 16),
        # Documents: the token column is named, and its length varies.
        ({"tokens": "ndarray:uint32", "loss_mask": "ndarray:uint8"}, "tokens", None),
        # A named token column of varying length is not replaced by another fixed column.
        ({"tokens": "ndarray:uint16", "mask": "ndarray:uint8:1024"}, "tokens", None),
        ({"a": "ndarray:uint8:2", "b": "ndarray:uint8:3"}, None, None),  # which? no guess
        ({"text": "str"}, None, None),
        ({}, None, None),
    ],
)
def test_the_token_column_and_its_tokens(
    columns: dict[str, str], name: str | None, tokens: int | None
) -> None:
    assert token_column(columns) == name
    assert tokens_per_sample(columns) == tokens


def test_columns_that_are_not_a_mapping_have_no_tokens() -> None:
    assert tokens_per_sample(None) is None
    assert tokens_per_sample(["tokens"]) is None
    assert TOKEN_COLUMNS == ("tokens", "input_ids")
