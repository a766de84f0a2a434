"""ReadOptions: the read knobs split out of CacheOptions (issue 23), and their deprecated
place on CacheOptions, which keeps working for a release."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from shardstream.client import CacheOptions, ReadOptions, StreamingDataset
from shardstream.client.options import READ_KNOBS, read_options
from shardstream.errors import ConfigError
from tests.fixtures.datasets import write_tokens


@pytest.fixture
def url(tmp_path: Path) -> str:
    write_tokens(tmp_path / "ds", 200, size_limit=600)
    return str(tmp_path / "ds" / "index.json")


def test_the_read_knobs_live_in_read_options_only() -> None:
    cache = {f.name for f in dataclasses.fields(CacheOptions)}
    assert set(READ_KNOBS) == {
        "download_threads",
        "prefetch_shards",
        "ranged_reads",
        "range_bytes",
        "read_ahead_batches",
        "piece_read_batches",
        "unverified_blocks",
        "memory_only",
        "memory_budget_bytes",
    }
    assert cache - set(READ_KNOBS) == {"dir", "limit_bytes", "open_shards", "require_hashes"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults warn about nothing
        assert read_options(CacheOptions(), None) == ReadOptions()


def test_a_dataset_takes_read_options(tmp_path: Path, url: str) -> None:
    read = ReadOptions(prefetch_shards=0, read_ahead_batches=3, piece_read_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = StreamingDataset(url, 8, cache=CacheOptions(dir=tmp_path / "c"), read=read)
    assert ds.stream.read_options == read
    assert sorted(i for b in ds for i in b["id"].tolist()) == list(range(200))
    ds.stream.close()


def test_a_read_knob_on_cache_options_warns_and_still_takes_effect(
    tmp_path: Path, url: str
) -> None:
    with pytest.warns(DeprecationWarning, match=r"ReadOptions\(memory_only=\.\.\.\)") as seen:
        cache = CacheOptions(memory_only=True)
    assert seen[0].filename == __file__  # points at the caller, not at options.py
    ds = StreamingDataset(url, 8, cache=cache)
    assert ds.stream.read_options == ReadOptions(memory_only=True)
    assert sorted(i for b in ds for i in b["id"].tolist()) == list(range(200))
    ds.stream.close()

    with pytest.warns(DeprecationWarning) as seen:
        both = CacheOptions(dir=tmp_path / "c", ranged_reads=False, prefetch_shards=0)
    (warning,) = seen
    assert "ReadOptions(prefetch_shards=..., ranged_reads=...)" in str(warning.message)
    assert read_options(both, None) == ReadOptions(ranged_reads=False, prefetch_shards=0)


def test_a_read_knob_in_both_places_is_one_config_error(url: str) -> None:
    with pytest.warns(DeprecationWarning):
        cache = CacheOptions(range_bytes=1 << 20)
    with pytest.raises(ConfigError, match=r"given twice: CacheOptions\(range_bytes\).*ReadOptions"):
        StreamingDataset(url, 8, cache=cache, read=ReadOptions(range_bytes=2 << 20))
    with pytest.raises(ConfigError, match="given twice"):  # also when the knobs differ
        read_options(cache, ReadOptions(ranged_reads=False))


def test_read_options_are_checked_wherever_they_are_given() -> None:
    with pytest.raises(ConfigError, match=r"ReadOptions.range_bytes must be >= 1"):
        ReadOptions(range_bytes=0)
    with pytest.raises(ConfigError, match=r"ReadOptions.prefetch_shards must be >= 0"):
        ReadOptions(prefetch_shards=-1)
    with pytest.raises(ConfigError, match="unverified_blocks"):
        ReadOptions(unverified_blocks="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ReadOptions.download_threads must be >= 1"):
        CacheOptions(download_threads=0)  # the deprecated place: checked the same way
    with pytest.raises(ConfigError, match=r"CacheOptions.open_shards must be >= 1"):
        CacheOptions(open_shards=0)
