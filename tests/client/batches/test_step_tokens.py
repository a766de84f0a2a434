"""The tokens a global step consumes (for phases that end by tokens): fixed by the global
batch and the packing, the same on every world size once the run's group is adopted, and
a clear error naming the fix where a step's tokens vary."""

from __future__ import annotations

from typing import cast

import pytest

from shardstream.client.batches.batch import ColumnSpec
from shardstream.client.batches.packed import Packer
from shardstream.client.batches.step_tokens import tokens_per_step
from shardstream.client.options import PackOptions
from shardstream.errors import ConfigError
from shardstream.mds import tokens_per_sample

DOCUMENTS = {"tokens": "ndarray:uint32"}


class _Spec:
    """The one part of a :class:`ColumnSpec` the packer reads."""

    def __init__(self, encodings: dict[str, str]) -> None:
        self.encodings = encodings


def _packer(options: PackOptions, per_rank: int) -> Packer:
    return Packer(options, cast(ColumnSpec, _Spec(DOCUMENTS)), per_rank)


@pytest.mark.parametrize("global_batch", [16, 48])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_a_packed_step_is_groups_x_rows_x_seq_len_on_every_world_size(
    global_batch: int, world: int
) -> None:
    per_rank = global_batch // world
    fixed_group = _packer(PackOptions(seq_len=64, rows=3, group=2), per_rank)
    assert tokens_per_step(DOCUMENTS, fixed_group, global_batch) == global_batch // 2 * 3 * 64
    # The default group is the first launch's per-rank batch; a resume adopts it, so a step
    # keeps the first launch's tokens on any world size.
    first = _packer(PackOptions(seq_len=64, rows=3), global_batch // 2)  # launched on 2 ranks
    resumed = _packer(PackOptions(seq_len=64, rows=3), per_rank)
    if per_rank % first.group == 0:
        resumed.adopt(first.params())
        assert tokens_per_step(DOCUMENTS, resumed, global_batch) == 2 * 3 * 64
        assert tokens_per_step(DOCUMENTS, first, global_batch) == 2 * 3 * 64


@pytest.mark.parametrize(
    ("encodings", "per_sample"),
    [
        ({"tokens": "ndarray:uint16:2048"}, 2048),
        ({"input_ids": "ndarray:int32:512", "id": "int"}, 512),
        ({"text": "str", "ids": "ndarray:uint32:4,128"}, 512),
        ({"tokens": "ndarray:uint16:1024", "mask": "ndarray:uint8:1024"}, 1024),
    ],
)
def test_an_unpacked_step_of_fixed_length_rows_is_batch_x_length(
    encodings: dict[str, str], per_sample: int
) -> None:
    assert tokens_per_step(encodings, None, 32) == 32 * per_sample


@pytest.mark.parametrize(
    ("encodings", "pack", "message"),
    [
        (DOCUMENTS, None, "column 'tokens' holds arrays of varying length .*PackOptions"),
        ({"text": "str"}, None, "no column is a fixed-length token array"),
        (
            {"a": "ndarray:uint16:8", "b": "ndarray:uint16:8"},
            None,
            "no column is a fixed-length token array",
        ),
        (DOCUMENTS, PackOptions(seq_len=64), "PackOptions.rows is None.*set PackOptions\\(rows"),
    ],
)
def test_a_step_whose_tokens_vary_is_refused_with_the_fix(
    encodings: dict[str, str], pack: PackOptions | None, message: str
) -> None:
    packer = None if pack is None else _packer(pack, 8)
    with pytest.raises(ConfigError, match=message) as info:
        tokens_per_step(encodings, packer, 8)
    assert "Phase(until=...)" in str(info.value)


@pytest.mark.parametrize(
    "columns",
    [
        {"tokens": "ndarray:uint16:2048"},
        {"ids": "ndarray:uint32:2,64", "text": "str"},
        {"tokens": "ndarray:uint16", "mask": "ndarray:uint8:1024"},
        {"a": "ndarray:uint8:2", "b": "ndarray:uint8:3"},
    ],
)
def test_the_client_and_the_server_agree(columns: dict[str, str]) -> None:
    """The step in tokens is the batch times shardstream.mds's tokens per sample (the
    server's mixture figures read the same rule), refused exactly where that has none."""
    per_sample = tokens_per_sample(columns)
    if per_sample is None:
        with pytest.raises(ConfigError):
            tokens_per_step(columns, None, 8)
    else:
        assert tokens_per_step(columns, None, 8) == 8 * per_sample
