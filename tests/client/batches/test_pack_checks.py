"""Read-time packing refuses what it cannot pack right (issue 35, items 3 and 4).

A loss mask that does not line up with its document (shorter, longer, values other than
0/1) would shift the masks of the group's later documents without a word: it is a
:class:`CorruptShardError` naming the sample and its shard. A mask column that is no
mask, and pack options outside what the data can hold (positions past int32, pad or EOS
ids past the token dtype), are one :class:`ConfigError` each, naming the bound, before
anything is allocated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.client import CacheOptions, PackOptions, PlanOptions, StreamingDataset
from shardstream.errors import ConfigError, CorruptShardError
from shardstream.mds import MDSWriter

COLUMNS = {"tokens": "ndarray:uint16", "loss_mask": "ndarray:uint8", "ids": "ndarray:uint32"}


def _write(out: Path, masks: dict[int, np.ndarray[Any, Any]] | None = None) -> Path:
    """16 documents of 5 + i tokens, mask 1 on each; ``masks`` replaces some masks."""
    with MDSWriter(out, COLUMNS) as writer:
        for i in range(16):
            n = 5 + i
            mask = (masks or {}).get(i, np.ones(n, np.uint8))
            ids = np.arange(n, dtype=np.uint32)
            writer.write({"tokens": np.full(n, 3, np.uint16), "loss_mask": mask, "ids": ids})
    return out


def _dataset(path: Path, tmp_path: Path, pack: PackOptions, batch: int = 8) -> StreamingDataset:
    return StreamingDataset(
        str(path),
        batch,
        plan=PlanOptions(shuffle=False),
        cache=CacheOptions(dir=tmp_path / "cache"),
        pack=pack,
    )


def _ids(name: str, value: int) -> dict[str, Any]:
    return {name: value}


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return _write(tmp_path / "good")


@pytest.mark.parametrize(
    "mask",
    [np.ones(1, np.uint8), np.ones(5 + 3 + 10, np.uint8)],
    ids=["1 value", "10 too many"],
)
def test_a_mask_that_does_not_match_its_document_is_corrupt(
    tmp_path: Path, mask: np.ndarray[Any, Any]
) -> None:
    path = _write(tmp_path / "ds", {3: mask})
    ds = _dataset(path, tmp_path, PackOptions(seq_len=32))
    with pytest.raises(CorruptShardError) as caught:
        list(ds)
    message = str(caught.value)
    assert f"has {len(mask)} values for 8 tokens" in message
    assert "sample 3" in message and "shard.00000.mds" in message


def test_a_mask_with_values_other_than_0_and_1_is_corrupt(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", {2: np.full(7, 2, np.uint8)})
    with pytest.raises(CorruptShardError, match=r"sample 2 .*holds 2; a mask's values are 0"):
        list(_dataset(path, tmp_path, PackOptions(seq_len=32)))


def test_a_mask_column_must_be_a_mask(good: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mask_column 'tokens' is the token column"):
        PackOptions(seq_len=32, mask_column="tokens")
    with pytest.raises(ConfigError, match=r"mask_column 'ids' is 'ndarray:uint32', not a loss"):
        _dataset(good, tmp_path, PackOptions(seq_len=32, mask_column="ids"))
    packed = next(iter(_dataset(good, tmp_path, PackOptions(seq_len=32))))
    assert set(packed["loss_mask"].unique().tolist()) == {0, 1}


@pytest.mark.parametrize("seq_len", [2**40, 2**31])
def test_a_seq_len_past_int32_positions_is_one_error(seq_len: int) -> None:
    with pytest.raises(ConfigError, match=r"seq_len must be 1\.\.2147483647 \(2\*\*31 - 1"):
        PackOptions(seq_len=seq_len)


def test_fixed_rows_past_int32_positions_are_one_error(good: Path, tmp_path: Path) -> None:
    pack = PackOptions(seq_len=2**30, rows=2, group=4)  # 2 groups x 2 rows x 2**30
    with pytest.raises(ConfigError, match=r"4 rows x seq_len 1073741824 .* int32"):
        _dataset(good, tmp_path, pack)


@pytest.mark.parametrize("name", ["pad_id", "eos_id"])
def test_a_token_id_past_the_token_dtype_is_one_error(
    good: Path, tmp_path: Path, name: str
) -> None:
    with pytest.raises(ConfigError, match=rf"{name}=70000 does not fit .*uint16: at most 65535"):
        _dataset(good, tmp_path, PackOptions(seq_len=32, **_ids(name, 70000)))


@pytest.mark.parametrize("name", ["pad_id", "eos_id"])
def test_a_token_id_past_int64_is_one_error(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"{name} must be a token id, 0\.\.{2**63 - 1}"):
        PackOptions(seq_len=32, **_ids(name, 2**70))


def test_a_column_without_a_declared_dtype_is_checked_on_its_data(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"tokens": "ndarray"}) as writer:
        for i in range(8):
            writer.write({"tokens": np.full(5 + i, 3, np.uint16)})
    ds = _dataset(tmp_path / "ds", tmp_path, PackOptions(seq_len=32, pad_id=70000))
    with pytest.raises(ConfigError, match=r"pad_id=70000 does not fit .*uint16"):
        list(ds)
