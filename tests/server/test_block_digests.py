"""Per-block digests survive publishing: builder -> server -> index.json and shard pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardstream.api_client import APIClient
from shardstream.mds import MDSWriter, index_from_json, load_index, verify_range
from shardstream.shard_builder.publish import DraftVersion
from tests.fixtures.server import LiveServer


def test_block_digests_reach_readers_through_the_server(live: LiveServer, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    rng = np.random.default_rng(0)
    # 100 KB shards in 4 KiB blocks: 25 digests, 400 hex digits, more than a wire hash holds.
    with MDSWriter(out, {"x": "bytes"}, size_limit=100_000, block_size=4096) as writer:
        for _ in range(60):
            writer.write({"x": rng.bytes(5000)})
    index = load_index(out / "index.json")
    digests = [s.block_digests for s in index.shards]
    assert len(digests) > 2 and all(d is not None for d in digests)
    assert max(d.num_blocks for d in digests if d is not None) > 16

    with DraftVersion(
        live.url, "blocky", token=live.token, columns={"x": "bytes"}, storage_root=str(out)
    ) as draft:
        draft.add_index(index)
    with APIClient(live.url, live.token) as api:
        served = load_index(api.index_json("blocky", draft.number))
        pages = [r["mds"] for page in api.iter_shard_pages("blocky", draft.number) for r in page]
        records = [r for page in api.iter_shard_pages("blocky", draft.number) for r in page]
    paged = index_from_json({"version": 2, "shards": pages})
    for got in (served, paged):
        assert [s.block_digests for s in got.shards] == digests
    for shard in paged.shards:
        verify_range(shard, 0, (out / shard.raw_data.basename).read_bytes())
    # The server's own hash field keeps the whole-file hashes only.
    assert all(set(r["hashes"]) == {"sha1", "xxh3_64"} for r in records)
