"""The fast loader's worker process: builds chunks of batches into its ring's slots.

Protocol (one pipe each way, per worker; all messages are small tuples):

* main -> worker: ``("start", gen, epoch, first_batch, step, lent)`` (abandon whatever
  runs, start a pass; ``lent`` lists the slots whose batches the training loop still
  holds, which stay untouched until freed), ``("free", gen, slot)`` (the main process is
  done with a slot, sent with the pass current at the time), ``("stop",)``.
* worker -> main: ``("chunk", gen, slot, items, counters)`` with one
  ``(b, refs, rest, names)`` per batch of the chunk and the worker's cumulative
  :class:`~shardstream.client.batches.input_stats.SourceCounters` as a tuple (a dozen numbers),
  ``("end", gen)``, ``("error", gen, message)``. ``refs`` locate tensors in the slot as
  ``(offset, dtype, shape)``; ``rest`` holds values that did not fit (pickled); ``names``
  is the batch's key order.

``gen`` numbers passes, so the main process drops messages of an abandoned pass. Before
each chunk the worker takes the frees that have arrived (one ``poll`` per chunk) and then
the slot freed last: a slot just written and read is still backed by memory, while a
slot never used costs a page fault per 4 KiB on first touch (~37 per 224 x 224 image,
measured as 6-12x the plain pool's system time). So a worker that keeps up with the
training loop cycles through two or three slots, whatever the ring's depth.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import torch

from shardstream.client.batches.input_stats import ProcessCounters
from shardstream.client.batches.stream import BatchStream
from shardstream.client.workers.ring import BatchRing, SlotAllocator

__all__ = ["worker_main"]


class _AbandonedError(Exception):
    """A new command replaced the running pass."""

    def __init__(self, command: tuple[Any, ...]) -> None:
        super().__init__()
        self.command = command


def worker_main(
    stream: BatchStream,
    ring: BatchRing,
    chunk: int,
    recv: Connection,
    send: Connection,
    *,
    measure: bool = True,
) -> None:
    """Serve passes until told to stop (or the main process goes away); ``measure``: count
    the input figures (:mod:`~shardstream.client.batches.input_stats`) and send them per chunk."""
    _detach_from_trainer_signals()
    torch.set_num_threads(1)  # the workers copy memory; the trainer owns the cores
    counters = ProcessCounters(lambda: stream.read_stats) if measure else None
    try:
        command: tuple[Any, ...] = recv.recv()
        while command[0] == "start":
            command = _serve(stream, ring, chunk, (recv, send), command, counters=counters)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        stream.close()


def _detach_from_trainer_signals() -> None:
    """Make the worker die with the trainer, whatever handlers the trainer installed.

    A forked worker inherits the trainer's Python signal handlers: frameworks such as
    Lightning catch SIGTERM to checkpoint, which would make multiprocessing's exit-time
    ``terminate()`` a no-op and leave the trainer waiting for its workers forever. SIGINT
    (Ctrl-C reaches the whole process group) is the trainer's to handle; it closes the
    workers. And should the trainer be SIGKILLed, the kernel ends the workers too
    (``PR_SET_PDEATHSIG``), instead of leaving orphans blocked on pipes that sibling
    workers keep open.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the trainer died before prctl took effect
            os._exit(0)


def _serve(
    stream: BatchStream,
    ring: BatchRing,
    chunk: int,
    pipes: tuple[Connection, Connection],
    start: tuple[Any, ...],
    *,
    counters: ProcessCounters | None,
) -> tuple[Any, ...]:
    """Run one pass; return the next command that is not a ``free``."""
    recv, send = pipes
    _, gen, epoch, first, step, lent = start
    # A stack: pop() takes the slot freed last (warm); slot 0 first.
    free = [slot for slot in reversed(range(ring.slots)) if slot not in lent]
    alloc = SlotAllocator(ring)

    def take_slot() -> int:
        while not free or recv.poll():
            cmd = recv.recv()
            if cmd[0] != "free":
                raise _AbandonedError(cmd)
            if cmd[1] == gen:  # a free sent before this pass started is not ours
                free.append(cmd[2])
        slot = free.pop()
        alloc.reset(slot)
        if counters is not None:
            counters.ring(ring.slots - len(free), ring.slots)
        return slot

    chunks: Iterator[list[tuple[int, dict[str, Any]]]] = stream.chunks(
        epoch, first, step, alloc=alloc, max_chunk=chunk
    )
    try:
        while True:
            slot = take_slot()
            if counters is None:
                built = next(chunks, None)
            else:
                with counters.building():
                    built = next(chunks, None)
            if built is None:
                break
            items = []
            for b, batch in built:
                refs: dict[str, tuple[int, str, tuple[int, ...]]] = {}
                rest: dict[str, Any] = {}
                for name, value in batch.items():
                    ref = ring.locate(value, slot) if isinstance(value, torch.Tensor) else None
                    if ref is None:
                        rest[name] = value
                    else:
                        refs[name] = ref
                items.append((b, refs, rest, list(batch)))
            figures = () if counters is None else counters.snapshot().astuple()
            send.send(("chunk", gen, slot, items, figures))
        send.send(("end", gen))
    except _AbandonedError as abandon:
        return abandon.command
    except Exception as exc:
        detail = "".join(traceback.format_exception(exc))
        send.send(("error", gen, f"{type(exc).__name__}: {exc}\n{detail}"))
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    while True:  # wait for the next pass, dropping slot returns of this one
        cmd = recv.recv()
        if cmd[0] != "free":
            return tuple(cmd)
