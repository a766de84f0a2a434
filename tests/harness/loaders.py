"""Build the loader a harness rank iterates, and read sample ids out of its batches.

``shardstream``: the real :class:`shardstream.client.ShardstreamLoader` over a
:class:`shardstream.client.StreamingDataset` (the thing the resume tests prove).

``toy``: a few lines of ``DataLoader`` over an id permutation with the same position
contract (global batches consumed, rank slices, worker ``b`` round robin). It exists only
to test the harness itself: that the launcher, the kill, the logs and the comparisons work
and that the comparisons catch a loader that resumes wrongly (``toy-skip`` drops a batch
on resume).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from tests.harness.config import TrainerConfig
from tests.harness.datasets import expected_tokens
from tests.harness.records import IdArray

ID_COLUMN = "id"


class ResumableLoader(Protocol):
    """What the trainer needs from a loader."""

    def __iter__(self) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def commit(self, step: int) -> None: ...

    def close(self) -> None: ...


def build_loader(cfg: TrainerConfig, rank: int, world_size: int) -> ResumableLoader:
    """The loader for this rank, as ``cfg.loader`` says.

    With ``cfg.resume_server`` the loader is built with ``resume=`` (``"latest"`` or a
    step): it loads the state the run committed to the server.
    """
    if cfg.loader == "toy":
        if cfg.resume_server is not None:
            raise RuntimeError("the toy loader has no server to resume from")
        return ToyLoader(cfg, rank, world_size)
    return _build_shardstream_loader(cfg, rank, world_size)


def batch_ids(batch: Any, expected: npt.NDArray[Any] | None = None) -> IdArray:
    """The global sample ids of one batch, in batch order, after checking the batch.

    Ids come from the harness's ``id`` column when the dataset has one, else from the
    client's ``sample_id`` (its global id by the plan); both must agree when both exist.
    The ``tokens`` must be the ones that sample was written with: from the ``id`` formula
    (:func:`expected_tokens`) or, given ``expected``, that table's rows. So a sample that
    decoded wrong or came from the wrong place fails the step.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"a batch must map column names to tensors, got {type(batch).__name__}")
    ids = _as_int64(batch[ID_COLUMN] if ID_COLUMN in batch else batch["sample_id"])
    if "sample_id" in batch and not np.array_equal(_as_int64(batch["sample_id"]), ids):
        raise AssertionError(f"sample_id {batch['sample_id']} != id column {ids}")
    if "tokens" in batch:
        tokens = np.asarray(batch["tokens"])
        want = expected[ids] if expected is not None else expected_tokens(ids)
        if not np.array_equal(tokens, want):
            raise AssertionError(f"tokens of samples {ids.tolist()} decoded wrong")
    return ids


def packed_rows(batch: Any) -> IdArray | None:
    """A packed batch's rows as one int64 per position, ``token << 16 | position`` (row
    major), or None for a batch that is not packed: what says two runs packed alike."""
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        return None
    tokens = _as_int64(batch["input_ids"])
    positions = _as_int64(batch["position_ids"])
    if positions.size and int(positions.max()) >= 1 << 16:
        raise AssertionError("position ids past 65535: the rows log cannot hold them")
    out: IdArray = (tokens << 16) | positions
    return out


def _as_int64(values: Any) -> IdArray:
    if isinstance(values, torch.Tensor):
        values = values.numpy()
    return np.asarray(values).astype(np.int64, copy=False).reshape(-1)


def _build_shardstream_loader(cfg: TrainerConfig, rank: int, world_size: int) -> ResumableLoader:
    """The real loader (rank and world size reach it through ``torch.distributed``)."""
    from shardstream.client.dataset import StreamingDataset
    from shardstream.client.loader import ShardstreamLoader
    from shardstream.client.options import (
        CacheOptions,
        DecodeOptions,
        PackOptions,
        PlanOptions,
        ReadOptions,
        ServerOptions,
    )
    from shardstream.plan import MixtureSchedule

    data = cfg.data
    dataset = StreamingDataset(
        [data.source, *data.more_sources],
        batch_size=data.global_batch_size // world_size,
        plan=PlanOptions(
            shuffle=data.shuffle,
            seed=data.seed,
            num_partitions=data.num_partitions,
            window=data.window,
            epoch_size=data.epoch_size,
            schedule=MixtureSchedule.from_params(data.schedule),
        ),
        pack=None if data.pack is None else PackOptions(**data.pack),  # type: ignore[arg-type]
        cache=CacheOptions(
            dir=None if data.cache_dir is None else Path(data.cache_dir),
            limit_bytes=data.cache_limit_bytes,
            **({} if data.open_shards is None else {"open_shards": data.open_shards}),
        ),
        read=ReadOptions(
            **({} if data.prefetch_shards is None else {"prefetch_shards": data.prefetch_shards}),
            **data.read_extra,  # type: ignore[arg-type]
        ),
        decode=DecodeOptions(sample_ids=True),
        server=None if data.server is None else ServerOptions(url=data.server, run=data.run_id),
    )
    srv = cfg.resume_server
    resume = None if srv is None else srv.ranks.get(str(rank), srv.which)
    loader: ResumableLoader = ShardstreamLoader(dataset, num_workers=cfg.num_workers, resume=resume)
    return loader


class _ToyBatches(IterableDataset[dict[str, torch.Tensor]]):
    """Rank ``rank``'s slice of every global batch from ``start``; worker w of n takes
    batches ``start + w, start + w + n, ...`` (the order DataLoader's round robin reads)."""

    def __init__(self, perm: IdArray, global_batch: int, rank: int, world: int, start: int):
        self.perm, self.global_batch, self.rank, self.world = perm, global_batch, rank, world
        self.start = start

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        per_rank = self.global_batch // self.world
        for b in range(self.start + wid, len(self.perm) // self.global_batch, nw):
            lo = b * self.global_batch + self.rank * per_rank
            yield {ID_COLUMN: torch.from_numpy(self.perm[lo : lo + per_rank].copy())}


class ToyLoader:
    """The harness's stand-in loader (source ``toy:<n>`` or ``toy-skip:<n>``)."""

    def __init__(self, cfg: TrainerConfig, rank: int, world_size: int) -> None:
        kind, _, n = cfg.data.source.partition(":")
        self._skip_on_resume = kind == "toy-skip"
        self._perm = np.random.default_rng(cfg.data.seed).permutation(int(n)).astype(np.int64)
        self._cfg, self._rank, self._world = cfg, rank, world_size
        self._consumed = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        ds = _ToyBatches(
            self._perm, self._cfg.data.global_batch_size, self._rank, self._world, self._consumed
        )
        for batch in DataLoader(ds, batch_size=None, num_workers=self._cfg.num_workers):
            self._consumed += 1  # counted when the training loop takes it, not when prefetched
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position: global batches consumed."""
        return {"batches": self._consumed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a position (``toy-skip`` deliberately lands one batch late)."""
        self._consumed = int(state["batches"]) + (1 if self._skip_on_resume else 0)

    def commit(self, step: int) -> None:
        """The toy has no server."""
        raise RuntimeError("the toy loader has no server to commit to")

    def close(self) -> None:
        """Nothing to release: the DataLoader ends its workers when its pass ends."""
