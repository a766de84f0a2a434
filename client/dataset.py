"""``StreamingDataset``: a torch ``IterableDataset`` of whole batches streamed from shards.

It yields one dict per batch (column -> tensor of shape ``(batch_size, ...)``), so use it
with ``DataLoader(dataset, batch_size=None)``. Each rank reads its share of every global
batch of the epoch plan; each DataLoader worker ``w`` of ``n`` builds the rank's batches
``w, w + n, ...``, which the DataLoader hands out round-robin, so the rank sees batches
``0, 1, 2, ...`` in order for any worker count.

It speaks torchdata's ``Stateful`` protocol (``state_dict`` / ``load_state_dict``), so
``StatefulDataLoader`` resumes it exactly, and :class:`~shardstream.client.ShardstreamLoader`
drives it with its own faster workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from shardstream.client.batches.batch import ColumnSpec, numpy_allocator
from shardstream.client.batches.footprint import (
    CacheFootprint,
    compute_footprint,
    warn_if_too_small,
)
from shardstream.client.batches.input_stats import InputMeter, InputStats, ProcessCounters
from shardstream.client.batches.sample_transform import SampleTransform
from shardstream.client.batches.stream import BatchStream, BatchTransform
from shardstream.client.distributed import Topology, current_worker
from shardstream.client.options import (
    CacheOptions,
    DecodeOptions,
    PackOptions,
    PlanOptions,
    ReadOptions,
    ServerOptions,
    Source,
    read_options,
)
from shardstream.client.resume import ReaderResume
from shardstream.client.sources.source import ResolvedSource, resolve_source
from shardstream.client.state import ReaderState
from shardstream.errors import ConfigError

__all__ = ["StreamingDataset"]

SourceLike = str | Source

# At the end of an epoch, how long background cache fills may take to land (they hold only
# the last blocks and the whole-shard check by then); a fill cut off is fetched next epoch.
FINISH_FILLS_S = 30.0


def shared_allocator(
    name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    """Arrays in torch shared memory, for DataLoader workers.

    A chunk's batches are views of one block; sending a view of private memory would make
    torch copy the whole block into shared memory for every batch. A block that already
    lives in shared memory is sent as a handle, with no copy at all.
    """
    like = torch.from_numpy(np.empty(0, dtype)).dtype
    block = torch.empty(shape, dtype=like)
    block.share_memory_()  # type: ignore[no-untyped-call]
    out: np.ndarray[Any, Any] = block.numpy()
    return out


class StreamingDataset(torch.utils.data.IterableDataset[dict[str, Any]]):
    """Batches of one dataset or a weighted mixture, for this rank, in plan order.

    ``sources``: a dataset name on the server (``"name"``, ``"name@version"``), an
    ``index.json`` URL/path, a :class:`Source`, or a list of them (a mixture; weights in
    each :class:`Source`). ``batch_size`` is per rank; the global batch is
    ``batch_size x world size``. ``topology`` defaults to ``Topology.discover()``
    (``torch.distributed`` or ``RANK``/``WORLD_SIZE``). ``sample_transform`` is applied to
    every sample inside the worker (images as ``uint8`` ``(C, H, W)`` tensors; random
    augmentations replay exactly on resume: :mod:`~shardstream.client.batches.sample_transform`),
    then the samples are collated; ``transform`` is applied to every whole batch.
    ``cache`` is the node's disk cache (:class:`CacheOptions`), ``read`` how shards are
    read from storage into it or into memory (:class:`ReadOptions`: downloads, ranged and
    piece reads, the cacheless mode).
    ``pack`` packs each batch of documents into fixed-length rows (:class:`PackOptions`;
    docs/training.md "Packing and masks"); ``batch_size`` then counts documents.

    >>> ds = StreamingDataset("s3://bucket/tokens/index.json", batch_size=32)  # doctest: +SKIP
    >>> loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)  # doctest: +SKIP
    >>> for batch in loader: batch["tokens"].shape  # torch.Size([32, 2048])  # doctest: +SKIP

    The epoch: call :meth:`set_epoch` at the start of every epoch (as with
    ``DistributedSampler``). Without it, a process that finished a pass plays the next
    epoch on its next pass; but DataLoader workers that are not persistent start from
    this object's epoch each time.
    """

    def __init__(
        self,
        sources: SourceLike | Sequence[SourceLike],
        batch_size: int,
        *,
        plan: PlanOptions | None = None,
        cache: CacheOptions | None = None,
        read: ReadOptions | None = None,
        decode: DecodeOptions | None = None,
        server: ServerOptions | None = None,
        topology: Topology | None = None,
        transform: BatchTransform | None = None,
        sample_transform: SampleTransform | None = None,
        pack: PackOptions | None = None,
    ) -> None:
        super().__init__()
        items = [sources] if isinstance(sources, str | Source) else list(sources)
        if not items:
            raise ConfigError("StreamingDataset needs at least one source")
        specs = [s if isinstance(s, Source) else Source(s) for s in items]
        self.server = server
        if server is not None and server.run is not None:
            from shardstream.client._server import check_run

            check_run(server)  # now, not at the first commit hours into training
        cache = cache or CacheOptions()
        reading = read_options(cache, read)  # ConfigError if both carry read settings
        self.resolved: list[ResolvedSource] = [
            resolve_source(s, server, cache.root, require_hashes=cache.require_hashes)
            for s in specs
        ]
        columns = ColumnSpec(
            [(r.source.uri, r.shards[0]) for r in self.resolved], decode or DecodeOptions()
        )
        self.topology = topology if topology is not None else Topology.discover()
        self.stream = BatchStream(
            self.resolved,
            batch_size,
            topology=self.topology,
            plan=plan or PlanOptions(),
            cache=cache,
            read=reading,
            spec=columns,
            transform=transform,
            sample_transform=sample_transform,
            pack=pack,
        )
        self.resume = ReaderResume(self.stream)
        """This reader's resume: the states it makes and loads, the epoch rollover."""
        self._epoch = 0
        self._next = 0  # next batch this process yields (its own, when a worker)
        self._slot: tuple[int, int] | None = None
        self._loaded: ReaderState | None = None  # a loaded state, until the next pass
        self._size_checked = False
        self._meter: InputMeter | None = None  # made by the first in-process iteration

    # -- epochs -------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the current (or next) pass reads."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` on the next pass. Keeps a loaded resume position of that epoch."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if self._loaded is not None and self._loaded.epoch == epoch:
            return
        if epoch != self._epoch:
            self._loaded = None
            self._epoch, self._next, self._slot = epoch, 0, None

    @property
    def num_batches(self) -> int:
        """Batches per rank in the current epoch (equal on every rank)."""
        return self.stream.num_batches(self._epoch)

    def __len__(self) -> int:
        return self.num_batches

    # -- iteration ------------------------------------------------------------------------

    def footprint(self, num_workers: int = 0) -> CacheFootprint:
        """What this job holds in each node's cache at once, for its plan and cache options
        and ``num_workers`` DataLoader workers per rank: set ``CacheOptions.limit_bytes`` to
        at least ``bytes_per_node`` (see :mod:`~shardstream.client.batches.footprint`)."""
        return compute_footprint(self.stream, num_workers, self._epoch)

    def check_cache_size(self, num_workers: int) -> None:
        """Warn once (per process) when the cache limit is below :meth:`footprint`."""
        if not self._size_checked:
            self._size_checked = True
            warn_if_too_small(self.stream, num_workers)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = current_worker()
        w, n = worker.worker_id, worker.num_workers
        if w == 0:
            self.check_cache_size(n)
        loaded, self._loaded = self._loaded, None
        epoch, start = self.resume.start(loaded, self._epoch, w, n)
        self._epoch, self._slot = epoch, (w, n) if n > 1 else None
        self._next = start
        try:
            alloc = shared_allocator if worker.in_worker else numpy_allocator
            batches = self.stream.batches(epoch, start, n, alloc=alloc)
            if not worker.in_worker:  # the training loop iterates here: time its waits
                if self._meter is None:
                    self._meter = InputMeter(ProcessCounters(lambda: self.stream.read_stats))
                batches = self._meter.timed(batches)
            for b, batch in batches:
                # Advance before yielding: a state taken while the consumer holds this
                # batch must count it (torchdata snapshots right after the yield).
                self._next = b + n
                yield batch
            self._epoch, self._next = epoch + 1, w
            self.stream.close(finish_fills_s=FINISH_FILLS_S)  # the epoch ended: keep its fills
        finally:
            self.stream.close()

    def stats(self) -> InputStats:
        """This process's input figures when the dataset is iterated in it (directly, or by
        a ``DataLoader`` with ``num_workers=0``): the loop's data wait beside its step,
        batch-ready latency, storage and cache figures, and the verdict. Iterated by a
        ``DataLoader``'s worker processes, the main process sees none of it: use
        :class:`~shardstream.client.ShardstreamLoader`, which measures its workers."""
        if self._meter is None:
            raise ConfigError(
                "no input figures: this dataset was not iterated in this process yet (a "
                "DataLoader's workers measure in their own processes; ShardstreamLoader "
                "collects them)"
            )
        return self._meter.stats()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_meter"] = None  # this process's clocks and counters stay here
        return state

    # -- torchdata Stateful protocol -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This process's position as a plain dict (see :class:`ReaderState`).

        In the main process (``num_workers=0``) the position is the number of global
        batches consumed; in a DataLoader worker it is that worker's own next batch, which
        is what ``StatefulDataLoader`` stores per worker.
        """
        if self._loaded is not None:
            return self._loaded.to_dict()
        first = 0 if self._slot is None else self._slot[0]  # the pass is complete: next epoch
        epoch, batch = self.resume.past_end(self._epoch, self._next, first)
        return self.resume.state(epoch, batch, self._slot).to_dict()

    def load_state_dict(
        self, state_dict: Mapping[str, Any], *, allow_changes: Iterable[str] = ()
    ) -> None:
        """Resume from a :meth:`state_dict` (of this dataset, a worker, or the loader).

        A whole ``StatefulDataLoader.state_dict()`` is accepted too: its workers' positions
        are merged into the global one, so a new ``StatefulDataLoader`` over this dataset,
        with any ``num_workers`` and without its own ``load_state_dict``, continues it.

        A state that differs from this reader in anything that decides the order (the
        order algorithm, the versions, a plan parameter, the data's fingerprint) is
        refused with a :class:`ResumeError` naming every difference, unless each is named
        in ``allow_changes`` (e.g. ``["seed"]``); accepted changes are recorded in every
        later state (``changes``).
        """
        state = self.resume.load(state_dict, allow_changes, stateful_loader=True)
        self._loaded = state
        self._epoch = state.epoch
