"""The build worker: one Ray actor per CPU, doing every step but the bookkeeping.

An actor runs a kind's worker step on units of work (:meth:`BuildWorker.work`: tokenize,
encode documents, check images: the local builder's own functions, the tokenizer loaded
once per process); the payloads stay in the Ray object store of its node and only their
counts go to the driver. Asked to write a shard (:meth:`BuildWorker.write`), it gathers
that shard's pieces (from its own node or another), writes the file as the kind's
:class:`~..cut.ShardLayout` says and uploads it straight to the output (multipart, through
:mod:`shardstream.storage`) after writing its journal entry, and returns the
:class:`ShardInfo`: the only thing of a shard the driver ever holds.

This module does not import Ray; :mod:`.pool` turns :class:`BuildWorker` into an actor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardstream.mds import ShardInfo
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.cut import ShardLayout, UnitResult
from shardstream.shard_builder.journal import JOURNAL_DIR, record_done, shard_key
from shardstream.shard_builder.packing import Piece
from shardstream.shard_builder.result import WorkerStats
from shardstream.shard_builder.sink import local_output_dir
from shardstream.storage import open_store

_SHARD_MODE = 0o644


@dataclass(frozen=True)
class ShardJob:
    """A shard to write: its position, its pieces of which units' payloads (``units``: the
    order the payloads come in), how it is written, and its journal entry's ``resume``
    (where the input stands after it)."""

    position: int
    pieces: tuple[Piece, ...]
    units: tuple[int, ...]
    layout: ShardLayout
    resume: dict[str, Any]


class WorkerOutput:
    """Where a worker puts a shard it wrote: the output folder, or the object store.

    The codec writes each shard into a staging folder; :meth:`store` then writes the
    shard's journal entry and only after it puts the shard under its name, so a shard that
    a re-run finds in the output always has its entry, however far the driver got (it is
    checked against the shard before it is reused; an entry whose shard never arrived is
    ignored).
    """

    def __init__(self, output: str) -> None:
        local = local_output_dir(output)
        self._store = open_store(output)
        self._local = local.absolute() if local is not None else None
        if self._local is not None:  # a path every node sees (one machine, or a shared FS)
            # Beside the shards (the same file system: a rename puts one in place), in the
            # journal's folder, which the build deletes at its end.
            staging = self._local / JOURNAL_DIR
            staging.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix="worker-", dir=staging))
        else:
            self.folder = Path(tempfile.mkdtemp(prefix="shardstream-ray-"))

    def store(self, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
        """The codec wrote ``info``'s file into :attr:`folder`: journal it, then make it
        part of the output."""
        name = info.stored.basename
        path = self.folder / name
        record_done(self._store, position, info, resume)
        if self._local is not None:
            path.chmod(_SHARD_MODE)  # the codec's temp files are 0600
            final = self._local / name
            final.parent.mkdir(parents=True, exist_ok=True)  # a spread-prefix folder
            os.replace(path, final)
            return
        try:
            self._store.upload(path, name)
        finally:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove the staging folder."""
        shutil.rmtree(self.folder, ignore_errors=True)


class BuildWorker:
    """A Ray actor (see :mod:`.pool`) that runs kinds' worker steps and writes shards."""

    def __init__(self, output: str, options: OutputOptions) -> None:
        self._out = WorkerOutput(output)
        self._options = options
        self._name = f"{_node_name()} pid {os.getpid()}"
        self._chunks = self._items = self._input = self._shards = self._written = 0
        self._busy = 0.0
        self._cpu = 0.0
        self._cpu_mark = time.process_time()

    def name(self) -> str:
        """Node address and process id (also: answers once the actor is up)."""
        return self._name

    def node_id(self) -> str:
        """The Ray node this actor runs on (hex)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def work(self, step: Callable[[Any], UnitResult], task: Any, nbytes: int) -> tuple[Any, Any]:
        """Run a kind's worker ``step`` on one unit's ``task`` (``nbytes`` of input): its
        count (for the driver) and its payload (stays here, for :meth:`write`)."""
        started = time.perf_counter()
        result = step(task)
        self._account(started, chunks=1, items=result.items, input_bytes=nbytes)
        return result.count(), result.payload

    def write(self, job: ShardJob, *payloads: Any) -> ShardInfo:
        """Write ``job``'s shard from its pieces of the units' ``payloads`` (in the order of
        ``job.units``), store it with its journal entry."""
        started = time.perf_counter()
        layout = job.layout
        data = layout.data(job.pieces, dict(zip(job.units, payloads, strict=True)))
        key = shard_key(job.position, self._options.spread_prefixes)
        info = layout.write(self._out.folder, key, data, self._options)
        self._out.store(job.position, info, job.resume)
        self._account(started, shards=1, written=info.stored.bytes)
        return info

    def stats(self) -> WorkerStats:
        """What this worker did so far."""
        return WorkerStats(
            name=self._name,
            chunks=self._chunks,
            items=self._items,
            input_bytes=self._input,
            busy_s=self._busy,
            cpu_s=self._cpu,
            shards=self._shards,
            written_bytes=self._written,
        )

    def close(self) -> None:
        """Remove the worker's staging folder."""
        self._out.close()

    def _account(
        self,
        started: float,
        *,
        chunks: int = 0,
        items: int = 0,
        input_bytes: int = 0,
        shards: int = 0,
        written: int = 0,
    ) -> None:
        self._busy += time.perf_counter() - started
        cpu = time.process_time()  # this process: the tokenizer's threads included
        self._cpu += cpu - self._cpu_mark
        self._cpu_mark = cpu
        self._chunks += chunks
        self._items += items
        self._input += input_bytes
        self._shards += shards
        self._written += written


def _node_name() -> str:
    """``10.0.0.5 node 3fa2c1d0``: the node's address and the start of its Ray node id."""
    with contextlib.suppress(Exception):
        import ray

        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return f"{ip} node {ray.get_runtime_context().get_node_id()[:8]}"
    return socket.gethostname()
