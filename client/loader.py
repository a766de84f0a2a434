"""``ShardstreamLoader``: the fast path from shards to the training loop.

``num_workers`` forked worker processes each build whole batches (one gather per shard
run) straight into a ring of shared-memory slots and pass the main process only slot
indices (see :mod:`shardstream.client.workers.ring`). Worker ``w`` builds the rank's batches
``b0 + w, b0 + w + n, ...`` and the main process takes them round-robin, so batches reach
the training loop in plan order.

The loader counts the batches the training loop actually took, not what workers have
prefetched: :meth:`state_dict` is ``(epoch, batches consumed)`` plus the plan parameters
and version ids, and :meth:`load_state_dict` restarts the workers at that batch, O(1).

>>> loader = ShardstreamLoader(dataset, num_workers=2)            # doctest: +SKIP
>>> for epoch in range(loader.epoch, 10):                          # doctest: +SKIP
...     loader.set_epoch(epoch)
...     for batch in loader:
...         train_step(batch)
...     torch.save({"data": loader.state_dict()}, "ckpt.pt")
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from shardstream.client.batches.image_augment import RandomResizedCropFlip
from shardstream.client.batches.image_stage import ImageStage, StageRun
from shardstream.client.batches.input_stats import InputMeter, InputStats, ProcessCounters
from shardstream.client.dataset import FINISH_FILLS_S, StreamingDataset
from shardstream.client.workers.pool import WorkerError, WorkerPool
from shardstream.errors import ConfigError, ShardstreamError

__all__ = ["ShardstreamLoader", "WorkerError"]


class ShardstreamLoader:
    """Iterates a :class:`StreamingDataset`'s batches with fast worker processes.

    ``num_workers=0`` builds batches in the calling process. ``prefetch`` is the number of
    ring slots (chunks of batches in flight) per worker. With ``copy=True`` (default) a
    batch can be kept as long as you like: its tensors view the worker's shared memory,
    which goes back to the worker once they are garbage collected (past ``prefetch // 2``
    slots held per worker, batches are copied out instead, so keeping every batch never
    stalls the workers); with ``copy=False`` the batch tensors view the slot and stay
    valid only until the next batch is requested. ``resume`` (``"latest"`` or a step)
    loads the state committed to the server for the dataset's run
    (``ServerOptions(run=...)``).

    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) with a dataset whose
    ``sample_transform`` is a :class:`RandomResizedCropFlip`: the workers hand over encoded
    images and their boxes, and an :class:`~shardstream.client.batches.image_stage.ImageStage`
    decodes and augments each batch on ``device`` in one go, on its own CUDA stream, a
    batch ahead; every tensor of the batch is on ``device``.

    ``stats`` (default on) times the training loop's wait for each batch and collects the
    workers' input figures: :meth:`stats` says whether the job is input-bound, and why
    (see :mod:`~shardstream.client.batches.input_stats`); every :meth:`commit` sends the figures
    since the previous one to the server. ``log_stats_every=N`` shows them every ``N``
    batches: logged (logger ``shardstream.client.stats``, level INFO) where logging shows
    INFO for it, else written to stderr, so the line is seen without setting up logging.
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        *,
        num_workers: int = 2,
        prefetch: int = 4,
        copy: bool = True,
        resume: str | int | None = None,
        device: str | torch.device | None = None,
        stats: bool = True,
        log_stats_every: int | None = None,
    ) -> None:
        if log_stats_every is not None and log_stats_every < 1:
            raise ConfigError(f"log_stats_every must be >= 1 or None, got {log_stats_every}")
        if num_workers < 0 or prefetch < 1:
            raise ConfigError(
                f"num_workers must be >= 0 and prefetch >= 1 (got {num_workers}, {prefetch})"
            )
        self.dataset = dataset
        self._stage = None if device is None else _image_stage(dataset, device)
        self._run: StageRun | None = None
        self.num_workers = num_workers
        dataset.check_cache_size(num_workers)
        self.prefetch = prefetch
        self.copy = copy
        self._epoch, self._consumed = dataset.epoch, 0
        self._meter: InputMeter | None = None
        if stats:
            local = None if num_workers else ProcessCounters(lambda: dataset.stream.read_stats)
            self._meter = InputMeter(local, log_every=log_stats_every)
            self._meter.num_workers = num_workers
        self._pool = WorkerPool(dataset.stream, num_workers, prefetch, copy=copy, meter=self._meter)
        # The run's ledger (ServerOptions(run=...)): this start's attempt number, registered
        # before the first batch, and the (trainer step, epoch, batch) it resumed from.
        self._attempt: int | None = None
        self._resumed: tuple[int | None, int, int] | None = None
        # A resumed start's first commit waits for the server's answer: a resume the
        # server refuses (a model step beside another step's data) fails in the commit
        # that is wrong, before the trainer saves a model of that step, not one later.
        self._first_commit = False
        if resume is not None:
            from shardstream.client._server import load_checkpoint_at

            step, state = load_checkpoint_at(dataset, resume)
            self.load_state_dict(state, step=step)

    # -- position -----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch being (or next to be) read."""
        return self._epoch

    def __len__(self) -> int:
        return self.dataset.stream.num_batches(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next; a no-op if already positioned in it (e.g. after a resume)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._epoch, self._consumed = self.dataset.resume.past_end(self._epoch, self._consumed)
        if epoch != self._epoch:
            self._epoch, self._consumed = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        """``(epoch, batches consumed)`` + plan parameters + version ids, as a plain dict."""
        resume = self.dataset.resume
        return resume.state(*resume.past_end(self._epoch, self._consumed)).to_dict()

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        allow_changes: Iterable[str] = (),
        step: int | None = None,
    ) -> None:
        """Continue from ``state_dict``: the next batch is the first one not consumed.

        Differences in what decides the order are refused unless named in
        ``allow_changes`` (see :meth:`StreamingDataset.load_state_dict`). With a run id,
        ``step`` is the trainer's step (of the model checkpoint it restored): before the
        first batch the server checks that the run's checkpoint at that step is at this
        state's position (without ``step``, that some checkpoint is), and records this
        start in the run's ledger (see docs/training.md)."""
        state = self.dataset.resume.load(state_dict, allow_changes)
        if state.worker is not None:
            raise ConfigError(
                "this is one DataLoader worker's state; give the loader's own state_dict()"
            )
        self._epoch, self._consumed = state.epoch, state.batch
        self._resumed, self._attempt = (step, state.epoch, state.batch), None
        self._first_commit = True

    def commit(self, step: int, *, wait: bool = False) -> None:
        """Store the current state on the server as the run's checkpoint at ``step``.

        Returns at once: the commit is sent in order by a background thread (one per
        process), retried while the server is unreachable, and flushed by
        :meth:`flush_commits`, :meth:`close` and at process exit. A commit that failed
        is logged and raised by the next ``commit`` or ``flush_commits``. ``wait=True``
        returns only once this commit is durable on the server. The first commit after
        a resume always waits: the server checks there that the trainer's steps and the
        loader's position agree, and a refusal is raised by that commit.
        """
        from shardstream.client._server import commit_checkpoint

        report = None
        if self._meter is not None:
            topology = self.dataset.topology
            report = self._meter.report_window().report(topology.rank, topology.world_size)
        attempt = self._register()
        first = self._first_commit
        commit_checkpoint(
            self.dataset, step, self.state_dict(), wait=wait or first, stats=report, attempt=attempt
        )
        self._first_commit = False

    def _register(self) -> int | None:
        """This start's attempt in the run's ledger (registered once, before the first
        batch or commit); None without a run id."""
        server = self.dataset.server
        if self._attempt is None and server is not None and server.run is not None:
            from shardstream.client._server import register_attempt

            self._attempt = register_attempt(self.dataset, self._resumed, self.num_workers)
        return self._attempt

    def stats(self) -> InputStats:
        """This rank's input figures since the loader was made: the training loop's data
        wait beside its step time, batch-ready latency, storage, peer and cache figures,
        the workers' build time, and the verdict (input-bound? I/O- or CPU-bound?).

        >>> str(loader.stats().verdict)   # doctest: +SKIP
        'not_input_bound'
        """
        if self._meter is None:
            raise ConfigError("this loader was made with stats=False: it measures nothing")
        return self._meter.stats()

    def flush_commits(self, timeout: float | None = None) -> None:
        """Wait until every commit made so far is durable; raise if one failed."""
        from shardstream.client._server import flush_commits

        flush_commits(self.dataset, timeout)

    # -- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._register()  # a refused resume fails here, before the first batch
        self._stop_stage()
        self._epoch, self._consumed = self.dataset.resume.past_end(self._epoch, self._consumed)
        epoch, start = self._epoch, self._consumed
        if self.num_workers == 0:
            built = self._inline(epoch, start)
        else:
            # With a stage, a thread drives the pass: fork the workers here, on this
            # thread, as PR_SET_PDEATHSIG would kill them when the forking thread ends.
            gen = self._pool.begin(epoch, start) if self._stage is not None else None
            built = self._pool.batches(epoch, start, gen)
        if self._stage is not None:  # a thread drives the workers, a batch ahead
            self._run = self._stage.run(built)
            built = iter(self._run)
        if self._meter is not None:
            built = self._meter.timed(built)
        return self._counted(built)

    def _inline(self, epoch: int, start: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """The pass built in this process (``num_workers=0``). Its read path (threads,
        leases, memory files) is closed when the pass ends, is abandoned (the loop broke
        out of the epoch) or fails, as :class:`StreamingDataset`'s own iteration does."""
        stream = self.dataset.stream
        try:
            yield from stream.batches(epoch, start)
            stream.close(finish_fills_s=FINISH_FILLS_S)  # the epoch ended: keep its fills
        finally:
            stream.close()

    def _counted(self, built: Iterator[tuple[int, dict[str, Any]]]) -> Iterator[dict[str, Any]]:
        """Count a batch as consumed when the training loop takes it, not when built."""
        for b, batch in built:
            self._consumed = b + 1
            yield batch

    def _stop_stage(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.stop()

    def close(self) -> None:
        """Flush the commits, then stop the workers (daemons: they also end with this
        process), or with ``num_workers=0`` close this process's read path. A failed
        commit is raised once the workers are stopped."""
        try:
            self.flush_commits()
        finally:
            self._stop_workers()
            if self.num_workers == 0:
                self.dataset.stream.close()

    def _stop_workers(self) -> None:
        self._stop_stage()
        self._pool.stop()

    def __enter__(self) -> ShardstreamLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # keep the error in flight; a failed commit was logged when it failed
            with contextlib.suppress(ShardstreamError):
                self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._stop_workers()


def _image_stage(dataset: StreamingDataset, device: str | torch.device) -> ImageStage:
    """The device stage for ``dataset``; its workers then hand over encoded images."""
    samples = dataset.stream.samples
    if samples is None or not isinstance(samples.transform, RandomResizedCropFlip):
        raise ConfigError(
            f"ShardstreamLoader(device={str(device)!r}) decodes and augments images on the "
            "device: give the dataset sample_transform=RandomResizedCropFlip(...) (got "
            f"{type(samples.transform).__name__ if samples else None})"
        )
    if dataset.stream.spec.options.decode_min_size is not None:
        raise ConfigError(
            "decode_min_size changes the image sizes the boxes are drawn for; the device "
            "stage decodes at full size: leave decode_min_size unset"
        )
    try:
        stage = ImageStage(samples.transform, device)
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from None
    samples.hand_over_images = True
    return stage
