"""Shard keys spread over hashed prefixes: stable, and an index that uses them is still
read by MosaicML's StreamingDataset and by our client."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import streaming

from shardstream.client import CacheOptions, PlanOptions, StreamingDataset
from shardstream.mds import MDSWriter
from shardstream.storage._keys import spread_key

N = 300


def test_spread_key_is_a_stable_hashed_folder() -> None:
    assert spread_key("shard.00003.mds") == spread_key("shard.00003.mds")
    prefix, _, name = spread_key("shard.00003.mds").partition("/")
    assert name == "shard.00003.mds" and len(prefix) == 4
    prefixes = {spread_key(f"shard.{i:05}.mds").split("/")[0] for i in range(64)}
    assert len(prefixes) > 50  # 64 shards land on (nearly) 64 prefixes


def _spread_dataset(out: Path) -> None:
    """A dataset written as usual, then moved under hashed prefixes (index rewritten)."""
    with MDSWriter(out, {"id": "int", "x": "ndarray:int32:4"}, size_limit=2000) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(4, i, dtype=np.int32)})
    index = json.loads((out / "index.json").read_text())
    for shard in index["shards"]:
        key = spread_key(shard["raw_data"]["basename"])
        (out / key).parent.mkdir(exist_ok=True)
        (out / shard["raw_data"]["basename"]).rename(out / key)
        shard["raw_data"] = dict(shard["raw_data"], basename=key)
    (out / "index.json").write_text(json.dumps(index))
    assert len(index["shards"]) > 4 and not list(out.glob("shard.*"))


def test_mosaicml_and_shardstream_read_spread_shards(tmp_path: Path) -> None:
    _spread_dataset(tmp_path / "ds")
    theirs = streaming.StreamingDataset(
        remote=str(tmp_path / "ds"), local=str(tmp_path / "mcache"), shuffle=False, batch_size=1
    )
    assert [int(theirs[i]["id"]) for i in range(len(theirs))] == list(range(N))
    ours = StreamingDataset(
        str(tmp_path / "ds"),
        10,
        cache=CacheOptions(dir=tmp_path / "c"),
        plan=dataclasses.replace(PlanOptions(), shuffle=False),
    )
    ids = sorted(i for batch in ours for i in batch["id"].tolist())
    assert ids == list(range(N))
