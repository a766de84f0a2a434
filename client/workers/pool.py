"""The fast loader's process pool, parent side: fork, deferred start, receive, slot loans, stop.

:class:`WorkerPool` owns the ``num_workers`` forked processes of one
:class:`~shardstream.client.ShardstreamLoader` and their rings (the child side is
:mod:`.worker`; the protocol is described there). Worker ``w`` builds batches
``first + w, first + w + n, ...`` of a pass, and :meth:`WorkerPool.batches` takes them
round-robin, so batches come out in plan order. The loader composes it with its
position, its commits and its optional device stage; the pool knows nothing of those.

Each pass has a number (``gen``): starting a pass abandons the previous one, whose
messages are then dropped, and the workers are forked again only if one died.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from shardstream.client.batches.input_stats import InputMeter
from shardstream.client.batches.stream import MAX_CHUNK, BatchStream
from shardstream.client.workers.ring import BatchRing, SlotLoans, view_in
from shardstream.client.workers.worker import worker_main
from shardstream.errors import ShardstreamError

__all__ = ["WorkerError", "WorkerPool"]


class WorkerError(ShardstreamError):
    """A loader worker raised, or died (e.g. killed by the OOM killer)."""


class _Worker:
    def __init__(
        self, proc: BaseProcess, loans: SlotLoans, cmd: Connection, data: Connection
    ) -> None:
        self.proc, self.loans, self.ring, self.cmd, self.data = proc, loans, loans.ring, cmd, data
        # (b, slot, refs, rest, names, last of its slot) received but not yet handed out
        self.pending: deque[tuple[int, int, Any, dict[str, Any], list[str], bool]] = deque()
        self.lent: tuple[int, torch.Tensor | None] | None = None  # (slot, view or copies)


class WorkerPool:
    """``num_workers`` forked builders of ``stream``'s batches, each with a ring of
    ``prefetch`` slots. ``copy`` as in :class:`~shardstream.client.ShardstreamLoader`;
    ``meter`` takes the workers' input counters as they arrive, and keeps them when the
    workers stop (None: the workers measure nothing).
    """

    def __init__(
        self,
        stream: BatchStream,
        num_workers: int,
        prefetch: int,
        *,
        copy: bool,
        meter: InputMeter | None = None,
    ) -> None:
        self.stream = stream
        self.num_workers = num_workers
        self.prefetch = prefetch
        self.copy = copy
        self._meter = meter
        self.workers: list[_Worker] = []
        self._gen = 0
        self._held: tuple[_Worker, int, int] | None = None  # slot lent out with copy=False
        self._deferred: list[tuple[_Worker, tuple[Any, ...]]] = []  # starts after batch 1
        self._returned: deque[tuple[SlotLoans, int]] = deque()  # lent slots now unused

    def begin(self, epoch: int, start: int) -> int:
        """Start the pass of ``epoch`` from batch ``start`` (forking workers if needed);
        returns its number, for :meth:`batches`."""
        self._release_held()
        self._gen += 1
        self._start_pass(("start", self._gen, epoch, start, self.num_workers))
        return self._gen

    def batches(
        self, epoch: int, start: int, gen: int | None = None
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(b, batch)`` of the pass from ``start`` to the end of ``epoch`` (pass ``gen``
        if :meth:`begin` started it already); ends early once a newer pass begins."""
        if gen is None:
            gen = self.begin(epoch, start)
        n = self.num_workers
        total = self.stream.num_batches(epoch)
        for b in range(start, total):
            worker = self.workers[(b - start) % n]
            self._send_returned()
            if not worker.pending:
                self._receive(worker, gen, b)
            got, slot, refs, rest, names, last = worker.pending.popleft()
            self._start_deferred()
            if got != b:
                raise WorkerError(f"loader worker sent batch {got} where batch {b} was due")
            out = self._tensors(worker, slot, refs)
            out.update(rest)
            if last:  # the chunk's slot is done once its last batch is handed out
                lent, worker.lent = worker.lent, None
                if not self.copy:
                    self._held = (worker, gen, slot)
                elif lent is not None and lent[1] is None:  # copied out: free at once
                    worker.cmd.send(("free", gen, slot))
            if self._gen != gen:
                return  # a newer pass took over the workers
            yield b, {name: out[name] for name in names}  # the columns' order as built
            self._release_held()

    def _tensors(self, worker: _Worker, slot: int, refs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The batch's tensors in ``slot``: views of a lent slot, or copies."""
        ring = worker.ring
        if not self.copy:
            return {name: ring.tensor(slot, ref, copy=False) for name, ref in refs.items()}
        if worker.lent is None or worker.lent[0] != slot:  # the chunk's first batch decides
            view = worker.loans.lend(slot) if worker.loans.can_lend() else None
            worker.lent = (slot, view)
        view = worker.lent[1]
        if view is None:
            return {name: ring.tensor(slot, ref, copy=True) for name, ref in refs.items()}
        return {name: view_in(view, ref) for name, ref in refs.items()}

    def _send_returned(self) -> None:
        """Give the workers back the lent slots whose views were garbage collected."""
        while self._returned:
            loans, slot = self._returned.popleft()
            loans.back(slot)
            for worker in self.workers:
                if worker.loans is loans and worker.proc.is_alive():
                    with contextlib.suppress(BrokenPipeError, OSError):
                        worker.cmd.send(("free", self._gen, slot))

    def _receive(self, worker: _Worker, gen: int, b: int) -> None:
        """Block until ``worker`` sends its next chunk of pass ``gen``; queue its batches."""
        while True:
            try:
                # Blocking: a worker that dies closes its end of the pipe, which ends recv.
                msg = worker.data.recv()
            except (EOFError, OSError):
                worker.proc.join(timeout=5)
                raise WorkerError(
                    f"loader worker pid {worker.proc.pid} exited with code "
                    f"{worker.proc.exitcode} while building batch {b}; check memory (OOM) "
                    "and the worker's log; iterating again restarts the workers at the "
                    "first batch not consumed"
                ) from None
            if msg[1] != gen:
                continue
            if msg[0] == "error":
                raise WorkerError(f"loader worker failed on batch {b}: {msg[2]}")
            if msg[0] == "end":
                raise WorkerError(f"loader worker ended its pass where batch {b} was due")
            _, _, slot, items, figures = msg
            if figures and self._meter is not None:
                self._meter.worker(id(worker), figures)
            for i, (got, refs, rest, names) in enumerate(items):
                worker.pending.append((got, slot, refs, rest, names, i == len(items) - 1))
            return

    def _release_held(self) -> None:
        if self._held is not None:
            worker, gen, slot = self._held
            self._held = None
            if worker.proc.is_alive():
                worker.cmd.send(("free", gen, slot))

    def _start_pass(self, command: tuple[Any, ...]) -> None:
        """Send worker ``w`` the pass starting at ``first + w``, forking workers if needed.

        Only the first batch's worker starts at once; the others start when it has sent
        its first chunk. Cold, every worker's first batch needs tens of MB of blocks from
        the store, and fetched together they share the node's link and CPU: the first
        batch then waits for the others' bytes too. Warm, the delay is one batch's build.
        """
        name, gen, epoch, first, step = command
        self._deferred = []
        self._send_returned()
        fresh = not (self.workers and all(w.proc.is_alive() for w in self.workers))
        if fresh:
            self.stop()
        for w in range(self.num_workers):
            if fresh:  # worker 0 starts building while the next ones fork
                self.workers.append(self._fork(w))
            worker = self.workers[w]
            worker.pending.clear()
            worker.lent = None  # an abandoned chunk's view: its slot returns once unused
            cmd = (name, gen, epoch, first + w, step, sorted(worker.loans.out))
            if w == 0:
                worker.cmd.send(cmd)
            else:
                self._deferred.append((worker, cmd))

    def _start_deferred(self) -> None:
        """Start the workers that wait for the first batch (once per pass)."""
        deferred, self._deferred = self._deferred, []
        for worker, cmd in deferred:
            worker.cmd.send(cmd)

    def _fork(self, w: int) -> _Worker:
        """Fork worker ``w`` (a fork of a torch process takes tens of ms)."""
        ctx = mp.get_context("fork")  # the rings are inherited mappings: fork is required
        chunk = chunk_batches(self.stream)
        ring = BatchRing(self.prefetch, chunk * slot_bytes(self.stream))
        cmd_recv, cmd_send = ctx.Pipe(duplex=False)
        data_recv, data_send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=worker_main,
            args=(self.stream, ring, chunk, cmd_recv, data_send),
            kwargs={"measure": self._meter is not None},
            name=f"shardstream-loader-{w}",
            daemon=True,
        )
        proc.start()
        cmd_recv.close()
        data_send.close()
        return _Worker(
            proc, SlotLoans(ring, self.prefetch // 2, self._returned), cmd_send, data_recv
        )

    def stop(self) -> None:
        """Stop the workers (asked, then killed after 5 s); a later pass forks new ones."""
        if self._meter is not None:
            self._meter.workers_stopped()
        self._held = None
        self._deferred = []
        for worker in self.workers:
            with contextlib.suppress(BrokenPipeError, OSError):
                worker.cmd.send(("stop",))
        for worker in self.workers:
            worker.proc.join(timeout=5)
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join()
            worker.cmd.close()
            worker.data.close()
        self.workers = []


SAMPLE_CHUNK = 1
"""Batches per chunk with a ``sample_transform``: per-sample work has nothing to amortize,
and a slot written for the first time costs a page fault per 4 KiB (one-batch chunks:
25 faults per 224 x 224 image in a first epoch instead of 38; read_images.py earlier:
8 -> 2 batches was 82% -> 91% of the decode limit, no idle worker at a pass's end)."""


def chunk_batches(stream: BatchStream) -> int:
    """Batches a worker builds per chunk at most: :data:`MAX_CHUNK` amortizes numpy's
    per-call cost over gathers; per-sample work (decode, augment) has nothing to amortize,
    and big chunks would leave workers idle at the end of a pass while one finishes."""
    return SAMPLE_CHUNK if stream.samples is not None else MAX_CHUNK


TRANSFORMED_SAMPLE_BYTES = 1 << 20
"""Ring room per sample with a ``sample_transform``: a ``(3, 512, 512)`` uint8 crop or a
``(3, 224, 224)`` float32 one. Only the pages a batch touches are ever backed by memory;
a larger output still works, pickled through the pipe like torch's DataLoader does."""


def slot_bytes(stream: BatchStream) -> int:
    """Bytes one batch of fixed-size columns (and sample ids) needs, with alignment, and
    its packed rows with read-time packing (built in the same slot after the documents)."""
    shard = stream.sources[0].shards[0]
    sizes = dict(zip(shard.column_names, shard.column_sizes, strict=True))
    per_sample = sum(sizes[name] or 0 for name in stream.spec.fixed) + 8
    if stream.samples is not None:  # the transform's output size is unknown until it runs
        per_sample = max(per_sample, TRANSFORMED_SAMPLE_BYTES)
    packed = 0 if stream.packer is None else stream.packer.batch_bytes()  # built after
    return stream.batch_size * per_sample + 64 * (len(stream.spec.names) + 1) + packed
