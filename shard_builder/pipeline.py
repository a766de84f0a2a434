"""The builder's one pipeline: source -> ordered workers -> encoder -> sink -> journal -> result.

Every build runs through :func:`run_build`: ``build text`` (and ``--documents``), ``build
images``, ``import`` and the Ray drivers. A kind of build supplies a :class:`BuildKind`, and
only that:

* its **source**: the :attr:`~BuildKind.fingerprint` of what it reads and how, the
  :attr:`~BuildKind.units` of work in input order (each with ``nbytes``), where a resumed
  build starts (:meth:`~BuildKind.start`, from the journal's last record) and the picklable
  work item of a unit (:meth:`~BuildKind.task`);
* its **encoder**: the function a worker runs on a work item (:attr:`~BuildKind.work`), and
  what becomes of the results, taken in unit order (:meth:`~BuildKind.add`,
  :meth:`~BuildKind.finish`): samples cut into shards, each handed to
  :meth:`BuildRun.store` with the journal record a resume continues from; and the
  ``shardstream.json`` content (:meth:`~BuildKind.metadata`).

The pipeline owns the rest, once: an identical finished build is found and returned, the
journal is opened (refusing another build's output) and its finished shards reused, the
progress bar skips them, worker processes run the units with results in input order
(:func:`produce_locally`; a Ray driver replaces this step, see
:mod:`.cluster.driver`), each shard is stored then journaled in shard order, ``index.json``
is written last and the journal deleted, bad input discards the partial output, a failed
build removes an output folder it made and left empty, and the
:class:`~.result.BuildResult` carries the summary. Publishing (``--dataset``) wraps any
build the same way: :meth:`~.publish.DraftVersion.add_build` registers its result.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shardstream.errors import InputError
from shardstream.mds import ShardInfo, write_shard, write_shard_arrays
from shardstream.shard_builder.config import OutputOptions
from shardstream.shard_builder.journal import BuildJournal, DoneShard, shard_key
from shardstream.shard_builder.progress import BuildProgress
from shardstream.shard_builder.result import (
    BuildResult,
    completed_result,
    existing_result,
    finish_build,
)
from shardstream.shard_builder.sink import ShardSink
from shardstream.shard_builder.workers import ordered_map

__all__ = ["BuildKind", "BuildRun", "produce_locally", "run_build"]


class BuildRun:
    """One build in progress: its output, journal and progress bar, and the shards stored
    so far, in order (``shards[i]`` is shard ``i``).

    ``resume`` is the journal record of the last finished shard of an earlier run (``{}``
    for a fresh build), ``first`` the unit this run starts reading at.
    """

    def __init__(
        self,
        config: OutputOptions,
        sink: ShardSink,
        journal: BuildJournal,
        done: list[DoneShard],
        progress: BuildProgress,
    ) -> None:
        self.config = config
        self.sink = sink
        self.journal = journal
        self.progress = progress
        self.shards: list[ShardInfo] = [d.info for d in done]
        self.resume: dict[str, Any] = done[-1].resume if done else {}
        self.first = 0

    @property
    def final(self) -> bool:
        """Whether the earlier run stored the last shard (only the index was missing)."""
        return bool(self.resume.get("final"))

    def store(self, resume: dict[str, Any], write: Callable[[], ShardInfo]) -> ShardInfo:
        """The next shard: as a killed run stored it where the journal vouches for it (same
        position, same ``resume``), else ``write()`` into :attr:`ShardSink.staging`, then
        stored and journaled with ``resume`` (where the input stands after it)."""
        info = self.journal.take_or_store(len(self.shards), resume, write)
        self.shards.append(info)
        return info

    def store_samples(
        self, resume: dict[str, Any], columns: dict[str, str], samples: list[bytes]
    ) -> ShardInfo:
        """:meth:`store` the next shard of encoded ``samples`` (the codec's ``write_shard``)."""
        return self._store_with(write_shard, resume, columns, samples)

    def store_arrays(
        self, resume: dict[str, Any], columns: dict[str, str], arrays: dict[str, Any]
    ) -> ShardInfo:
        """:meth:`store` the next shard of fixed-shape ``arrays`` (``write_shard_arrays``)."""
        return self._store_with(write_shard_arrays, resume, columns, arrays)

    def _store_with(
        self, codec: Callable[..., ShardInfo], resume: dict[str, Any], columns: Any, data: Any
    ) -> ShardInfo:
        key = shard_key(len(self.shards), self.config.spread_prefixes)
        folder, fmt = self.sink.staging, self.config.shard_format()
        return self.store(resume, lambda: codec(folder, key, columns, data, fmt=fmt))

    def hand_over(self, position: int, info: ShardInfo, resume: dict[str, Any]) -> None:
        """Shard ``position`` (the next one), written in :attr:`ShardSink.staging` by another
        thread: store it, then journal it with ``resume``."""
        assert position == len(self.shards), (position, len(self.shards))
        self.shards.append(info)
        self.sink.stored(info, lambda: self.journal.record(position, info, resume))

    def took(self, info: ShardInfo) -> None:
        """The next shard, stored and journaled already (by a Ray worker)."""
        self.shards.append(info)


class BuildKind(ABC):
    """What one kind of build supplies to :func:`run_build`: its source and its encoder.

    The pipeline calls, in order: :attr:`fingerprint` (then returns an identical finished
    build as it is), :attr:`units`, :meth:`start`, :meth:`task` and :attr:`work` for every
    unit from :attr:`BuildRun.first` on (in worker processes), :meth:`add` for every result
    in unit order, :meth:`finish`, :meth:`metadata`; :meth:`close` on the way out, also
    after an error. The build's clock starts when the kind is made (planning counts).
    """

    #: The progress bar's label, e.g. ``"build text"``.
    desc: str = "build"

    def __init__(self, config: OutputOptions) -> None:
        self.config = config
        self.started = time.perf_counter()

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """The digest of the content options and the input lineage (``shardstream.json``)."""

    @property
    def journal_fingerprint(self) -> str:
        """The journal's fingerprint: also what its resume positions count in."""
        return self.fingerprint

    @property
    @abstractmethod
    def units(self) -> Sequence[Any]:
        """The units of work in input order, each with ``nbytes`` (read after the check
        for a finished build, so a kind may plan here what costs a read)."""

    @abstractmethod
    def start(self, run: BuildRun) -> int:
        """Take ``run.resume`` (maybe ``{}``): the number of the first unit to read."""

    @abstractmethod
    def task(self, number: int, unit: Any) -> Any:
        """The picklable work item of unit ``number`` for :attr:`work`."""

    @staticmethod
    @abstractmethod
    def work(task: Any) -> Any:
        """A worker process's step on one work item: a static method, or a module-level
        function (``work = staticmethod(fn)``), so that it pickles by name."""

    @abstractmethod
    def add(self, run: BuildRun, number: int, result: Any) -> tuple[int, int]:
        """Take unit ``number``'s result (all before it were taken): cut samples into
        shards (:meth:`BuildRun.store`). Returns the samples made and their bytes."""

    @abstractmethod
    def finish(self, run: BuildRun) -> None:
        """After the last unit: store the last shard (its record says ``"final": True``)."""

    @abstractmethod
    def empty_error(self) -> InputError:
        """The error of a build that made no shard."""

    @abstractmethod
    def metadata(self, run: BuildRun) -> dict[str, Any]:
        """The content of ``shardstream.json`` (``kind``, ``fingerprint``, ``columns``, ...)."""

    def close(self) -> None:  # noqa: B027 (most kinds hold nothing)
        """Release what the kind holds (threads, spool folders); runs also after errors."""


K = TypeVar("K", bound=BuildKind)
Producer = Callable[[K, BuildRun], None]


def produce_locally(kind: BuildKind, run: BuildRun) -> None:
    """The ordered workers: ``kind.work`` on ``config.workers`` processes, the results
    handed to the kind strictly in unit order (:func:`~.workers.ordered_map`), so shard
    boundaries never depend on scheduling or on the worker count."""
    units = kind.units
    tasks = (kind.task(n, units[n]) for n in range(run.first, len(units)))
    results = ordered_map(kind.work, tasks, workers=run.config.workers)
    for number, result in enumerate(results, start=run.first):
        samples, out_bytes = kind.add(run, number, result)
        run.progress.advance(units[number].nbytes, samples, out_bytes)
    kind.finish(run)


def run_build(kind: K, produce: Producer[K] | None = None) -> BuildResult:
    """Build ``kind`` into ``kind.config.output``; ``produce`` makes the shards (default:
    :func:`produce_locally`; the Ray drivers pass theirs).

    Re-running an interrupted build with the same options reuses its finished shards; a
    finished one is returned as it is. Raises the kind's :class:`InputError` for bad input
    (after deleting the partial output: fixing the input changes it) and
    :class:`~shardstream.errors.ConfigError` for an output holding another build.

    Example::

        result = run_build(TextKind(TextBuildConfig(output="out", inputs=("a.jsonl",))))
    """
    config = kind.config
    sink = ShardSink(config.output)
    try:
        if config.overwrite:
            sink.check_empty(overwrite=True)
        elif (done_result := existing_result(sink, kind.fingerprint)) is not None:
            return done_result
        units = kind.units
        journal = BuildJournal(sink, kind.journal_fingerprint)
        done = journal.start()
        total = sum(u.nbytes for u in units)
        progress = BuildProgress(total, desc=kind.desc, enabled=config.progress)
        run = BuildRun(config, sink, journal, done, progress)
        run.first = kind.start(run)
        with progress:
            progress.skip(sum(u.nbytes for u in units[: run.first]))
            if not run.final:
                (produce or produce_locally)(kind, run)
                if not run.shards:
                    raise kind.empty_error()
            sink.flush()
        metadata = kind.metadata(run)
        index = finish_build(sink, run.shards, metadata)
        journal.clear()
    except InputError:
        kind.close()  # nothing in flight while the partial output goes
        sink.discard_partial()  # fixing the input changes it: nothing here can be reused
        sink.close()
        sink.remove_created_dirs()
        raise
    except BaseException:
        kind.close()
        sink.close()
        # Finished shards stay for a resume (no index.json: no reader takes them for a
        # dataset); an output this build made that holds no shard goes whole.
        sink.discard_if_made_without_shards()
        raise
    finally:
        kind.close()
        sink.close()
    return completed_result(
        sink,
        index,
        metadata,
        config=config,
        reused_shards=len(done) + journal.reused_later,
        started=kind.started,
    )
