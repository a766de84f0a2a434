"""Fixed-``rows`` packing truncates what does not fit, and says so (issue 35, item 1).

Documents of 100-2,000 tokens in groups of 8 into 4 rows of 512: about three quarters of
the tokens cannot fit. Each batch carries its ``truncated_tokens``, the loader's stats
and stats line count placed and truncated tokens (with and without workers), the rank's
commits carry them to the server's input figures, and the packer warns once, naming
what to change.
"""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardstream.api_client import APIClient
from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PackOptions,
    PlanOptions,
    ServerOptions,
    ShardstreamLoader,
    StreamingDataset,
)
from shardstream.client.batches.packed import PackingTruncationWarning
from shardstream.mds import MDSWriter
from shardstream.shard_builder.publish import register_index
from shardstream.wire import InputStatsReport
from tests.fixtures.server import LiveServer

LENGTHS = np.random.default_rng(35).integers(100, 2001, 640).tolist()
CUT = PackOptions(seq_len=512, group=8, rows=4)


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """640 documents of 100-2,000 tokens (sample ``i`` has ``LENGTHS[i]``)."""
    out = tmp_path_factory.mktemp("docs") / "ds"
    columns = {"tokens": "ndarray:uint16", "loss_mask": "ndarray:uint8"}
    with MDSWriter(out, columns, size_limit=64 << 10) as writer:
        for n in LENGTHS:
            writer.write({"tokens": np.full(n, 7, np.uint16), "loss_mask": np.ones(n, np.uint8)})
    return out


def _dataset(path: Path, cache: Path, pack: PackOptions, **kw: Any) -> StreamingDataset:
    return StreamingDataset(
        str(path),
        16,
        plan=PlanOptions(seed=1),
        cache=CacheOptions(dir=cache),
        decode=DecodeOptions(sample_ids=True),
        pack=pack,
        **kw,
    )


def _read(loader: ShardstreamLoader) -> tuple[int, int, int]:
    """(document tokens, tokens placed, tokens the batches say were truncated)."""
    seen = placed = truncated = 0
    for batch in loader:
        seen += sum(LENGTHS[i] for i in batch["sample_id"].tolist())
        placed += int((batch["doc_ids"] >= 0).sum())
        assert batch["truncated_tokens"].shape == (16 // 8,)  # one count per group
        truncated += int(batch["truncated_tokens"].sum())
    return seen, placed, truncated


@pytest.mark.parametrize("workers", [0, 2])
def test_truncated_tokens_are_in_each_batch_the_stats_and_the_line(
    documents: Path, tmp_path: Path, workers: int
) -> None:
    with ShardstreamLoader(_dataset(documents, tmp_path / "c", CUT), num_workers=workers) as ld:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PackingTruncationWarning)
            seen, placed, truncated = _read(ld)
        stats = ld.stats()
    assert seen == sum(LENGTHS) and placed + truncated == seen
    assert truncated > 0.6 * seen  # three quarters of the tokens do not fit
    assert stats.source.truncated_tokens == truncated
    assert stats.source.packed_tokens == placed
    assert stats.source.truncated_share == pytest.approx(truncated / seen)
    assert f"packing truncated {truncated} of {seen} tokens" in stats.line()
    report = InputStatsReport.model_validate(stats.report(rank=0, world_size=1))
    assert report.truncated_tokens == truncated and report.packed_tokens == placed


def test_one_warning_names_what_to_change(documents: Path, tmp_path: Path) -> None:
    with (
        warnings.catch_warnings(record=True) as caught,
        ShardstreamLoader(_dataset(documents, tmp_path / "c", CUT), num_workers=0) as loader,
    ):
        warnings.simplefilter("always")
        _read(loader)
    cut = [w for w in caught if issubclass(w.category, PackingTruncationWarning)]
    assert len(cut) == 1, [str(w.message) for w in cut]
    message = str(cut[0].message)
    assert "truncated" in message and "PackOptions(rows=4)" in message
    assert "Raise rows" in message and "rows=None" in message


def test_rows_none_truncates_nothing_and_does_not_warn(documents: Path, tmp_path: Path) -> None:
    pack = PackOptions(seq_len=512, group=8, rows=None)
    with (
        warnings.catch_warnings(),
        ShardstreamLoader(_dataset(documents, tmp_path / "c", pack), num_workers=0) as loader,
    ):
        warnings.simplefilter("error", PackingTruncationWarning)
        seen, placed, truncated = _read(loader)
        stats = loader.stats()
    assert truncated == 0 and placed == seen == sum(LENGTHS)
    assert stats.source.truncated_tokens == 0 and stats.source.packed_tokens == seen
    assert f"packing truncated 0 of {seen} tokens (0.0%)" in stats.line()


def test_commits_carry_the_truncated_tokens_to_the_server(
    live_server: LiveServer, documents: Path, tmp_path: Path
) -> None:
    documents = Path(shutil.copytree(documents, tmp_path / "ds"))  # in the server's roots
    with APIClient(live_server.url, live_server.token) as api:
        register_index(api, str(documents / "index.json"), "docs")
        run = api.create_run([("docs", 1)], global_batch_size=16).id
    server = ServerOptions(url=live_server.url, token=live_server.token, run=run)
    ds = _dataset(documents, tmp_path / "c", CUT, server=server)
    truncated = 0
    with ShardstreamLoader(ds, num_workers=1) as loader, warnings.catch_warnings():
        warnings.simplefilter("ignore", PackingTruncationWarning)
        for step, batch in enumerate(loader, start=1):
            truncated += int(batch["truncated_tokens"].sum())
            time.sleep(0.001)
            if step % 10 == 0:
                loader.commit(step)
        loader.flush_commits()
        stats = loader.stats()
    assert step == 40 and stats.source.truncated_tokens == truncated
    with APIClient(live_server.url, live_server.token) as api:
        rank = api.input_stats(run).ranks[0]
    # Every batch was built before the last commit: the windows add up to all of them.
    assert rank.total.truncated_tokens == truncated
    assert rank.total.packed_tokens + truncated == sum(LENGTHS)
