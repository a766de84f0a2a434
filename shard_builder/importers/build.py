"""``build_import``: samples from a format module -> MDS shards, with the builder's guarantees.

Worker processes read input units (files, or parts of big files: see
:mod:`.source`) in parallel and encode their samples a batch of records at a time, into
one buffer per batch (:mod:`.unit`, :mod:`.columnar`); results come
back in unit order, and shard boundaries are cut from the samples' sizes alone, so they never
depend on scheduling or on the worker count. Each shard is then written from slices of
those buffers (a few hash updates and writes per slice, not per sample). The
schema (column -> MDS encoding) is taken from the first sample and checked on every
sample: a sample with other columns or encodings stops the import naming the file and
key, or is skipped and counted with ``skip_bad``. After every stored shard the journal
records the position (file, record in the file) where the next shard starts, so a killed
import resumes after its last finished shard, from the part that holds that record
(whatever ``part_bytes`` the new run splits with).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, InputError
from shardstream.mds import ShardInfo, shard_config, write_samples
from shardstream.shard_builder.config import OutputOptions, _as_tuple, content_options
from shardstream.shard_builder.importers.formats import FORMATS, get_format
from shardstream.shard_builder.importers.hf_documents import HfOption
from shardstream.shard_builder.importers.litdata import documents_option
from shardstream.shard_builder.importers.source import PART_BYTES, SourceUnit
from shardstream.shard_builder.importers.spool import SPOOL_DIR, clear_spool, spool_folder
from shardstream.shard_builder.importers.unit import EncodedUnit, UnitTask, encode_unit, schema_of
from shardstream.shard_builder.journal import fingerprint, shard_key
from shardstream.shard_builder.pipeline import BuildKind, BuildRun, run_build
from shardstream.shard_builder.progress import planning_progress
from shardstream.shard_builder.result import BadInput, BuildResult

IMPORTER_VERSION = 1
_SHARD_OVERHEAD = 4096  # header + config JSON, an upper bound


@dataclass(frozen=True, kw_only=True)
class ImportConfig(OutputOptions):
    """Options of ``shardstream import FORMAT SOURCE...``.

    ``format`` is one of :data:`FORMATS`; ``inputs`` are files, folders or (per format)
    patterns such as WebDataset's ``shard-{000000..000099}.tar``. ``skip_bad`` leaves out
    samples whose columns differ from the schema (reported in ``shardstream.json``).
    ``part_bytes`` is about how much input one worker task reads when a format splits big
    files (LMDB, LitData, TFRecord); it changes no output byte. ``keep_key`` keeps each
    WebDataset sample's key as the str column ``__key__``. ``split`` chooses the split of
    a Hugging Face DatasetDict folder (``""``: ``train``, said in the result's summary).
    ``documents`` keeps each document of a LitData token folder or each ``input_ids`` row
    of a Hugging Face dataset as one variable-length sample (ids checked below
    ``vocab_size``, which also makes them uint16 when it is <= 65,536).

    Example::

        cfg = ImportConfig(format="webdataset", inputs=("data/shard-{0000..0009}.tar",),
                           output="out/")
    """

    format: str = ""
    inputs: tuple[str, ...] = ()
    skip_bad: bool = False
    value_format: str = "raw"
    allow_pickle: bool = False
    split: str = ""
    seq_len: int | None = None
    documents: bool = False
    vocab_size: int | None = None
    keep_key: bool = True
    part_bytes: int = PART_BYTES

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "inputs", _as_tuple(self.inputs))
        if self.format not in FORMATS:
            raise ConfigError(f"import format {self.format!r}: choose from {', '.join(FORMATS)}")
        if not self.inputs:
            raise ConfigError(f"import {self.format}: give at least one source")
        if self.value_format == "pickle" and not self.allow_pickle:
            raise ConfigError(
                "value-format pickle: pickled values are unpickled only with --allow-pickle "
                "(allow_pickle=True). Loading a pickle runs whatever code it holds, with your "
                "permissions: allow it only for a database you wrote yourself or trust as "
                "you trust your own code; else convert the values to raw, json or npy first"
            )
        if self.value_format not in ("raw", "json", "npy", "pickle"):
            raise ConfigError(
                f"value-format {self.value_format!r}: choose raw, json, npy or pickle"
            )
        if self.seq_len is not None and (self.format != "litdata" or self.seq_len < 1):
            raise ConfigError("seq-len applies to litdata token imports and must be >= 1")
        if self.documents and (self.format not in ("litdata", "hf") or self.seq_len is not None):
            raise ConfigError(
                "documents applies to litdata token imports, without seq-len, and to hf "
                "imports of input_ids (each item or row stays one document, as `build text "
                "--documents` writes them)"
            )
        if self.vocab_size is not None and (not self.documents or self.vocab_size < 1):
            raise ConfigError(
                "vocab-size applies to hf and litdata --documents imports and must be >= 1"
            )
        if self.value_format != "raw" and self.format != "lmdb":
            raise ConfigError("value-format applies to lmdb imports only")
        if self.part_bytes < 1:
            raise ConfigError(f"part_bytes must be at least 1, got {self.part_bytes}")


def _infer_columns(fmt: str, units: list[SourceUnit]) -> tuple[tuple[str, str], ...]:
    for unit in units:
        for _, sample in get_format(fmt).read(unit):
            return schema_of(sample)
    raise InputError(f"no samples in {', '.join(u.path for u in units[:3])}")


class _Packer:
    """Greedy packing of encoded samples into shards of at most ``shard_size`` bytes.

    A sample goes into the open shard while header room + 4 + its size per sample fit in
    ``shard_size`` (a sample bigger than that gets a shard of its own). The cut points are
    found by binary search over a unit's cumulative sizes, so packing costs a few numpy
    calls per shard, not Python work per sample; the result is the same greedy rule.

    A full shard is hashed and written by a writer thread while this thread reads and
    encodes the next units: hashing (sha1 most of all) and writing release the GIL, and
    they cost as much as reading an LMDB or LitData source, so they overlap instead of
    adding up. Two to four shards are in flight at once (:func:`writer_threads`: the
    encoder goes on while the shard before the last is still written, and one thread
    hashes about 1 GB/s, which many encoder processes outrun); they are handed to the sink
    (and the journal) in shard order, as later ones are closed or at :meth:`finish`.
    """

    def __init__(
        self,
        run: BuildRun,
        *,
        config: ImportConfig,
        columns: dict[str, str],
        skipped: list[BadInput],
    ) -> None:
        self.skipped = skipped
        self._run, self._config = run, config
        self._template = shard_config(
            columns,
            compression=config.compression,
            hashes=config.hashes,
            size_limit=config.shard_size,
        )
        self._sizes: list[np.ndarray[Any, Any]] = []
        self._parts: list[memoryview] = []
        self._count = 0
        self._bytes = _SHARD_OVERHEAD
        self._writers = writer_threads(config.workers)
        self._writer = ThreadPoolExecutor(
            self._writers, thread_name_prefix="shardstream-import-writer"
        )
        self._pending: deque[tuple[Future[ShardInfo], int, dict[str, Any]]] = deque()

    def add_unit(self, file: int, unit: SourceUnit, done: EncodedUnit) -> None:
        """Add the samples of ``unit`` (a part of file number ``file``) in order, closing
        shards as they fill."""
        limit, n = self._config.shard_size, len(done.sizes)
        numbers = done.numbers + unit.first  # record numbers in the file
        bad = [(unit.first + number, b) for number, b in done.bad]
        steps = np.cumsum(done.sizes + 4)  # bytes each sample adds to a shard, cumulated
        offsets = np.concatenate(([0], np.cumsum(done.sizes)))
        buffers = done.payload()
        ends = np.cumsum([len(b) for b in buffers], dtype=np.int64)
        pos = 0
        while pos < n:
            base = int(steps[pos - 1]) if pos else 0
            end = int(np.searchsorted(steps, limit - self._bytes + base, side="right"))
            if end <= pos:  # the next sample does not fit
                if self._count:
                    self.close_shard((file, int(numbers[pos])), bad)
                    continue
                end = pos + 1  # too big for any shard: it gets one of its own
            self._sizes.append(done.sizes[pos:end])
            self._parts.extend(_slices(buffers, ends, int(offsets[pos]), int(offsets[end])))
            self._count += end - pos
            self._bytes += int(steps[end - 1]) - base
            pos = end
        self.skipped.extend(b for _, b in bad)

    def close_shard(
        self,
        next_position: tuple[int, int],
        unit_bad: Sequence[tuple[int, BadInput]] = (),
        *,
        final: bool = False,
    ) -> None:
        """Write the open shard; the next one starts at ``next_position`` (file, record),
        after which come ``unit_bad``'s records numbered from it on (not yet skipped)."""
        if not self._count:
            return
        while len(self._pending) >= self._writers:
            self._hand_over()  # the oldest shard in flight
        position, cfg = len(self._run.shards) + len(self._pending), self._config
        before = [b for number, b in unit_bad if number < next_position[1]]
        state = {
            "next": list(next_position),
            "final": final,
            "skipped": [asdict(b) for b in [*self.skipped, *before]],
        }
        written = self._writer.submit(
            write_samples,
            self._run.sink.staging,
            shard_key(position, cfg.spread_prefixes),
            self._template,
            np.concatenate(self._sizes),
            self._parts,
            block_size=cfg.block_size,
            piece_size=cfg.piece_size,
        )
        self._pending.append((written, position, state))
        self._sizes, self._parts, self._count = [], [], 0
        self._bytes = _SHARD_OVERHEAD

    def finish(self) -> None:
        """Wait for the shards in flight and hand them to the sink in order (re-raising the
        first error)."""
        while self._pending:
            self._hand_over()

    def _hand_over(self) -> None:
        written, position, state = self._pending.popleft()
        self._run.hand_over(position, written.result(), state)

    def close(self) -> None:
        """Stop the writer threads (after the shards in flight, whose errors are dropped:
        this runs on the way out of a failed import)."""
        self._writer.shutdown(wait=True)
        self._pending.clear()


def build_import(config: ImportConfig) -> BuildResult:
    """Import ``config.inputs`` in ``config.format`` into MDS shards at ``config.output``.

    Raises :class:`InputError` for unreadable input (naming the file and record) and,
    without ``skip_bad``, for a sample whose columns differ from the first sample's.
    """
    return run_build(ImportKind(config))


class ImportKind(BuildKind):
    """An import for :func:`~shardstream.shard_builder.pipeline.run_build`: its source is
    the format's files cut into parts (the units), its encoder checks every sample
    against the schema and packs the samples into shards (:class:`_Packer`).

    Journal records hold the (file, record) where the next shard starts and the samples
    skipped before it.
    """

    config: ImportConfig

    def __init__(self, config: ImportConfig) -> None:
        super().__init__(config)
        self.desc = f"import {config.format}"
        self._format = fmt = get_format(config.format)
        option = {
            "lmdb": config.value_format,
            "litdata": (
                documents_option(config.vocab_size)
                if config.documents
                else str(config.seq_len or "")
            ),
            "webdataset": "key" if config.keep_key else "",
            "hf": HfOption(config.split, config.documents, config.vocab_size).encode(),
        }.get(config.format, config.split)
        with planning_progress(config.progress):
            self.files = [replace(u, option=option) for u in fmt.plan(config.inputs, option)]
        if not self.files:
            raise InputError(
                f"import {config.format}: no input files in {', '.join(config.inputs)}"
            )
        self.lineage = [u.lineage() for u in self.files]
        self.options = content_options(config)
        del self.options["part_bytes"]  # how the work is cut: no output byte depends on it
        if self.options["vocab_size"] is None:
            del self.options["vocab_size"]  # the same for imports made before the option
        if config.format != "webdataset":
            del self.options["keep_key"]  # only WebDataset samples have keys that are not columns
        self._fingerprint = fingerprint(
            {"importer": IMPORTER_VERSION, "options": self.options, "lineage": self.lineage}
        )
        self._parts: list[tuple[int, SourceUnit]] | None = None  # (file number, part)
        self.columns: tuple[tuple[str, str], ...] = ()
        self.skipped: list[BadInput] = []
        self._packer: _Packer | None = None
        self._staging: Path | None = None
        self._spool: str | None = None

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def units(self) -> Sequence[SourceUnit]:
        if self._parts is None:
            fmt, part_bytes = self._format, self.config.part_bytes
            with planning_progress(self.config.progress):
                self._parts = [
                    (i, part)
                    for i, f in enumerate(self.files)
                    for part in (fmt.split(f, part_bytes) if fmt.split else [f])
                ]
            # From the first part, not the whole file (a TFRecord part is read in one piece).
            self.columns = _infer_columns(self.config.format, [u for _, u in self._parts])
            self._units = [u for _, u in self._parts]
        return self._units

    def start(self, run: BuildRun) -> int:
        assert self._parts is not None
        self.skipped = [BadInput(**b) for b in run.resume.get("skipped", [])]
        self._first, self._skip = _start(self._parts, run.resume.get("next", [0, 0]))
        self._staging = run.sink.staging
        self._packer = _Packer(
            run, config=self.config, columns=dict(self.columns), skipped=self.skipped
        )
        return self._first

    def task(self, number: int, unit: SourceUnit) -> UnitTask:
        if self._spool is None:
            workers = self.config.workers
            self._spool = str(spool_folder(self._staging)) if workers > 1 and self._staging else ""
        skip = self._skip if number == self._first else 0
        return UnitTask(self.config.format, unit, skip, self.columns, self._spool)

    work = staticmethod(encode_unit)

    def add(self, run: BuildRun, number: int, result: EncodedUnit) -> tuple[int, int]:
        assert self._parts is not None and self._packer is not None
        if result.bad and not self.config.skip_bad:
            raise _bad_error([b for _, b in result.bad])
        file, unit = self._parts[number]
        self._packer.add_unit(file, unit, result)
        return len(result.sizes), int(result.sizes.sum())

    def finish(self, run: BuildRun) -> None:
        assert self._packer is not None
        self._packer.close_shard((len(self.files), 0), final=True)
        self._packer.finish()

    def empty_error(self) -> InputError:
        return InputError(f"no importable samples ({len(self.skipped)} skipped)")

    def metadata(self, run: BuildRun) -> dict[str, Any]:
        samples = sum(s.samples for s in run.shards)
        describe = self._format.describe
        return {
            "kind": "import",
            "format": self.config.format,
            "fingerprint": self._fingerprint,
            "columns": dict(self.columns),
            **({"layout": "documents"} if self.config.documents else {}),
            "samples": samples,
            "records_in": samples + len(self.skipped),
            "skipped": [asdict(b) for b in self.skipped],
            "config": self.options,
            "lineage": self.lineage,
            **(describe(self.files) if describe else {}),
        }

    def close(self) -> None:
        if self._packer is not None:
            self._packer.close()  # no shard write in flight while a partial output goes
        if self._staging is not None:
            clear_spool(self._staging / SPOOL_DIR)


def writer_threads(workers: int) -> int:
    """How many shards an import hashes and writes at once: two, so that the encoder never
    waits for the shard before the one it just closed (a tenth off a 1-worker LMDB or
    LitData import on 2 cores), and one per two encoder processes up to 4 (each holds a
    whole shard of samples in memory until it is written)."""
    return max(2, min(4, workers // 2))


def _slices(
    buffers: list[memoryview], ends: np.ndarray[Any, Any], lo: int, hi: int
) -> list[memoryview]:
    """Bytes ``[lo, hi)`` of the concatenation of ``buffers`` (``ends``: where each ends in
    it), as slices of the buffers."""
    out = []
    i = int(np.searchsorted(ends, lo, side="right"))
    while lo < hi:
        start = int(ends[i]) - len(buffers[i])
        stop = min(hi, int(ends[i]))
        out.append(buffers[i][lo - start : stop - start])
        lo, i = stop, i + 1
    return out


def _start(units: list[tuple[int, SourceUnit]], position: list[int]) -> tuple[int, int]:
    """Where a resumed import starts: the index of the part holding record ``position =
    [file, record]`` (``len(units)`` past the last file), and how many of its records to
    skip."""
    file, record = position
    if not units or file > units[-1][0]:
        return len(units), 0
    # Every file has a part starting at record 0, so this part is one of ``file``'s.
    start = max(i for i, (f, unit) in enumerate(units) if (f, unit.first) <= (file, record))
    return start, record - units[start][1].first


def _bad_error(bad: list[BadInput]) -> InputError:
    shown = "; ".join(f"{b.source}: {b.reason}" for b in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return InputError(
        f"{len(bad)} sample(s) cannot be imported: {shown}{more}; fix the input or pass "
        "--skip-bad to leave them out (they are then listed in shardstream.json)"
    )
