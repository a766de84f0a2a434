"""The fast loader's worker process: builds batches into its ring, announces slot indices.

Protocol (one pipe each way, per worker; all messages are small tuples):

* main -> worker: ``("start", gen, epoch, first_batch, step)`` (abandon whatever runs,
  start a pass), ``("free", gen, slot)`` (the main process is done with a slot of pass
  ``gen``), ``("stop",)``.
* worker -> main: ``("batch", gen, b, slot, refs, rest, names)``, ``("end", gen)``,
  ``("error", gen, message)``. ``refs`` locate tensors in the slot; ``rest`` holds any
  value that did not fit (pickled).

``gen`` numbers passes, so the main process drops messages of an abandoned pass.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import torch

from shardstream.client.ring import ArrayRef, BatchRing, SlotAllocator
from shardstream.client.stream import BatchStream

__all__ = ["worker_main"]


class _AbandonedError(Exception):
    """A new command replaced the running pass."""

    def __init__(self, command: tuple[Any, ...]) -> None:
        super().__init__()
        self.command = command


def worker_main(stream: BatchStream, ring: BatchRing, recv: Connection, send: Connection) -> None:
    """Serve passes until told to stop (or the main process goes away)."""
    torch.set_num_threads(1)  # the workers copy memory; the trainer owns the cores
    try:
        command: tuple[Any, ...] = recv.recv()
        while command[0] == "start":
            command = _serve(stream, ring, recv, send, command)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        stream.close()


def _serve(
    stream: BatchStream, ring: BatchRing, recv: Connection, send: Connection, start: tuple[Any, ...]
) -> tuple[Any, ...]:
    """Run one pass; return the next command that is not a ``free``."""
    _, gen, epoch, first, step = start
    free = list(range(ring.slots))
    alloc = SlotAllocator(ring)

    def take_slot() -> int:
        while not free or recv.poll():
            cmd = recv.recv()
            if cmd[0] == "free":
                if cmd[1] == gen:  # a late return from an abandoned pass is not ours
                    free.append(cmd[2])
            else:
                raise _AbandonedError(cmd)
        slot = free.pop(0)
        alloc.reset(slot)
        return slot

    batches: Iterator[tuple[int, dict[str, Any]]] = stream.batches(epoch, first, step, alloc=alloc)
    try:
        while True:
            slot = take_slot()
            item = next(batches, None)
            if item is None:
                break
            b, batch = item
            refs: dict[str, ArrayRef] = {}
            rest: dict[str, Any] = {}
            for name, value in batch.items():
                ref = ring.locate(value, slot) if isinstance(value, torch.Tensor) else None
                if ref is None:
                    rest[name] = value
                else:
                    refs[name] = ref
            send.send(("batch", gen, b, slot, refs, rest, list(batch)))
        send.send(("end", gen))
    except _AbandonedError as abandon:
        return abandon.command
    except Exception as exc:
        detail = "".join(traceback.format_exception(exc))
        send.send(("error", gen, f"{type(exc).__name__}: {exc}\n{detail}"))
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    while True:  # wait for the next pass, dropping slot returns of this one
        cmd = recv.recv()
        if cmd[0] != "free":
            return tuple(cmd)
