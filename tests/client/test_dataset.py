"""StreamingDataset on real shards: exactly-once, decoding, mixtures, DataLoader, resume."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.client import (
    CacheOptions,
    DecodeOptions,
    PlanOptions,
    Source,
    StreamingDataset,
    Topology,
)
from shardstream.errors import ConfigError, ResumeError
from tests.fixtures.datasets import (
    check_resume,
    ids_of,
    image_bytes,
    token_row,
    write_images,
    write_tokens,
)

N = 300


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokens") / "ds"
    write_tokens(out, N, size_limit=400, text=True)  # ~12 samples per shard, 25 shards
    return out


def make(path: Path, tmp: Path, batch: int = 4, **kw: object) -> StreamingDataset:
    kw.setdefault("cache", CacheOptions(dir=tmp / "cache"))
    return StreamingDataset(str(path / "index.json"), batch, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_sample_once_per_epoch_over_all_ranks(
    tokens_dir: Path, tmp_path: Path, world: int, shuffle: bool
) -> None:
    per_rank: list[list[list[int]]] = []
    for rank in range(world):
        ds = make(
            tokens_dir,
            tmp_path,
            batch=3,
            topology=Topology(rank=rank, world_size=world),
            plan=PlanOptions(shuffle=shuffle, seed=5, tail="pad"),
        )
        per_rank.append([ids_of(b) for b in ds])
    lengths = {len(batches) for batches in per_rank}
    assert len(lengths) == 1, "every rank must get the same number of batches"
    seen = Counter(i for batches in per_rank for batch in batches for i in batch)
    assert set(seen) == set(range(N))
    pads = sum(seen.values()) - N
    assert pads < 3 * world and all(c in (1, 2) for c in seen.values())


def test_batches_decode_tokens_text_and_ids(tokens_dir: Path, tmp_path: Path) -> None:
    ds = make(tokens_dir, tmp_path, batch=5, decode=DecodeOptions(sample_ids=True))
    batch = next(iter(ds))
    assert list(batch) == ["id", "text", "tokens", "sample_id"]
    assert batch["tokens"].dtype == torch.uint16 and batch["tokens"].shape == (5, 8)
    for i, row, text in zip(batch["id"].tolist(), batch["tokens"], batch["text"], strict=True):
        assert np.array_equal(row.numpy(), token_row(i))
        assert text == f"sample {i}" + "!" * (i % 5)
    assert batch["sample_id"].tolist() == batch["id"].tolist()


def test_column_selection_and_transform(tokens_dir: Path, tmp_path: Path) -> None:
    def shift(batch: dict[str, object]) -> dict[str, object]:
        tokens = batch["tokens"]
        assert isinstance(tokens, torch.Tensor)
        return {"x": tokens[:, :-1].long(), "y": tokens[:, 1:].long()}

    ds = make(tokens_dir, tmp_path, decode=DecodeOptions(columns=("tokens",)), transform=shift)
    batch = next(iter(ds))
    assert set(batch) == {"x", "y"} and batch["x"].shape == (4, 7)
    with pytest.raises(ConfigError, match="'nope'"):
        make(tokens_dir, tmp_path, decode=DecodeOptions(columns=("nope",)))


def test_images_are_decoded_with_pillow(tmp_path: Path) -> None:
    write_images(tmp_path / "img", 20)
    ds = make(tmp_path / "img", tmp_path, batch=4, plan=PlanOptions(shuffle=False))
    batch = next(iter(ds))
    assert batch["png"].shape == (4, 4, 6, 3) and batch["png"].dtype == torch.uint8
    for i, png, jpeg in zip(batch["id"].tolist(), batch["png"], batch["jpeg"], strict=True):
        assert bool((png == i).all())
        assert abs(int(jpeg.float().mean().round()) - i) <= 2
    raw = make(
        tmp_path / "img",
        tmp_path,
        batch=4,
        decode=DecodeOptions(decode_images=False),
        plan=PlanOptions(shuffle=False),
    )
    assert next(iter(raw))["png"][0] == image_bytes(0, "png")


def test_mixture_weights_set_each_sources_share(tmp_path: Path) -> None:
    write_tokens(tmp_path / "a", 200, size_limit=400)
    write_tokens(tmp_path / "b", 200, size_limit=400, first_id=1000)
    ds = StreamingDataset(
        [Source(str(tmp_path / "a"), weight=3), Source(str(tmp_path / "b"), weight=1)],
        batch_size=8,
        cache=CacheOptions(dir=tmp_path / "cache"),
    )
    ids = [i for b in ds for i in ids_of(b)]
    from_a = sum(i < 1000 for i in ids)
    assert len(ids) == 400 and from_a == 300  # 3:1 of the weighted sources' 400
    assert len(set(i for i in ids if i < 1000)) == 200  # a repeats only after using all
    first_batches = [ids_of(b) for _, b in zip(range(5), iter(ds), strict=False)]
    assert any(min(b) < 1000 <= max(b) for b in first_batches), "sources must interleave"


def test_plain_dataloader_workers_match_single_process(tokens_dir: Path, tmp_path: Path) -> None:
    ds = make(tokens_dir, tmp_path)
    reference = [ids_of(b) for b in ds]
    for workers in (0, 2):
        ds = make(tokens_dir, tmp_path)
        got = [ids_of(b) for b in DataLoader(ds, batch_size=None, num_workers=workers)]
        assert got == reference


def test_persistent_workers_play_successive_epochs(tokens_dir: Path, tmp_path: Path) -> None:
    single = make(tokens_dir, tmp_path)
    expected = [[ids_of(b) for b in single] for _ in range(2)]  # auto-advances epochs
    assert expected[0] != expected[1]
    ds = make(tokens_dir, tmp_path)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    got = [[ids_of(b) for b in loader] for _ in range(2)]
    assert got == expected


def test_set_epoch_with_fresh_workers(tokens_dir: Path, tmp_path: Path) -> None:
    ds = make(tokens_dir, tmp_path)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    ds.set_epoch(3)
    epoch3 = [ids_of(b) for b in loader]
    ref = make(tokens_dir, tmp_path)
    ref.set_epoch(3)
    assert epoch3 == [ids_of(b) for b in ref]


def test_dataset_state_dict_resumes_exactly(tokens_dir: Path, tmp_path: Path) -> None:
    n = len(make(tokens_dir, tmp_path))
    check_resume(lambda: make(tokens_dir, tmp_path), 2, cuts=[0, 7, n - 1, n, n + 3])


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(
    tokens_dir: Path, tmp_path: Path, workers: int
) -> None:
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(make(tokens_dir, tmp_path), batch_size=None, num_workers=workers)

    reference = [ids_of(b) for b in loader()]
    for cut in (5, len(reference) - 2):
        first = loader()
        it = iter(first)
        head = [ids_of(next(it)) for _ in range(cut)]
        state = first.state_dict()
        del it, first
        second = loader()
        second.load_state_dict(state)
        assert head + [ids_of(b) for b in second] == reference


def test_state_from_other_plan_is_refused(tokens_dir: Path, tmp_path: Path) -> None:
    state = make(tokens_dir, tmp_path, plan=PlanOptions(seed=1)).state_dict()
    with pytest.raises(ResumeError, match="seed: saved 1, now 2"):
        make(tokens_dir, tmp_path, plan=PlanOptions(seed=2)).load_state_dict(state)
    with pytest.raises(ResumeError, match="global_batch_size"):
        make(tokens_dir, tmp_path, batch=6, plan=PlanOptions(seed=1)).load_state_dict(state)


def test_elastic_state_moves_between_world_sizes(tokens_dir: Path, tmp_path: Path) -> None:
    """A 4-rank position resumes on 2 ranks with the same global batch (partitions kept)."""
    four = [make(tokens_dir, tmp_path, 2, topology=Topology(r, 4)) for r in range(4)]
    full = [[ids_of(b) for b in ds] for ds in four]  # per rank
    cut = 10
    state = four[0].state_dict()
    state["epoch"], state["batch"] = 0, cut
    two = [make(tokens_dir, tmp_path, 4, topology=Topology(r, 2)) for r in range(2)]
    rest = []
    for ds in two:
        ds.load_state_dict(state)
        rest.append([ids_of(b) for b in ds])
    for b in range(len(full[0]) - cut):
        assert sorted(rest[0][b] + rest[1][b]) == sorted(
            i for r in range(4) for i in full[r][cut + b]
        )


def test_cache_limit_smaller_than_dataset(tokens_dir: Path, tmp_path: Path) -> None:
    total = sum(p.stat().st_size for p in tokens_dir.glob("*.mds"))
    limit = total // 3
    ds = make(
        tokens_dir,
        tmp_path,
        cache=CacheOptions(dir=tmp_path / "small", limit_bytes=limit, open_shards=2),
    )
    ids = [i for b in ds for i in ids_of(b)]
    assert sorted(ids) == list(range(N))
    cached = sum(p.stat().st_size for p in (tmp_path / "small").rglob("*.mds"))
    assert cached <= limit + 3 * 400


def test_topology_from_environment_variables() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert Topology.discover(env) == Topology(3, 4, 1, 2)
    assert Topology.discover({}) == Topology(0, 1)
    with pytest.raises(ConfigError, match="RANK and WORLD_SIZE must be set together"):
        Topology.discover({"RANK": "1"})
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        Topology.discover({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="rank must be in"):
        Topology.discover({"RANK": "4", "WORLD_SIZE": "4"})


def test_dataset_reads_rank_from_environment(
    tokens_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from_env = make(tokens_dir, tmp_path)
    explicit = make(tokens_dir, tmp_path, topology=Topology(1, 2))
    assert from_env.topology.rank == 1
    assert [ids_of(b) for b in from_env] == [ids_of(b) for b in explicit]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_at_the_epoch_boundary(
    tokens_dir: Path, tmp_path: Path, workers: int
) -> None:
    def run(ds: StreamingDataset, loader: StatefulDataLoader, epoch: int) -> list[list[int]]:
        ds.set_epoch(epoch)
        return [ids_of(b) for b in loader]

    ds = make(tokens_dir, tmp_path)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    reference = [run(ds, loader, 0), run(ds, loader, 1)]
    assert reference[0] != reference[1]
    ds = make(tokens_dir, tmp_path)
    first = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    assert run(ds, first, 0) == reference[0]
    state = first.state_dict()
    ds = make(tokens_dir, tmp_path)
    second = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    second.load_state_dict(state)
    assert run(ds, second, 1) == reference[1]
