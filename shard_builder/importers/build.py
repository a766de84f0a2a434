"""``build_import``: samples from a format module -> MDS shards, with the builder's guarantees.

Worker processes read whole input units (files) in parallel and encode their samples;
results come back in unit order, so shard boundaries never depend on scheduling. The
schema (column -> MDS encoding) is taken from the first sample and checked on every
sample: a sample with other columns or encodings stops the import naming the file and
key, or is skipped and counted with ``skip_bad``. After every stored shard the journal
records the position (unit, record) where the next shard starts, so a killed import
resumes after its last finished shard.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from shardstream.errors import ConfigError, InputError
from shardstream.mds import ShardInfo, make_encoder, write_shard
from shardstream.shard_builder.config import OutputOptions, _as_tuple, content_options
from shardstream.shard_builder.importers.formats import FORMATS, get_format
from shardstream.shard_builder.importers.source import SourceUnit
from shardstream.shard_builder.journal import BuildJournal, fingerprint, shard_key
from shardstream.shard_builder.progress import BuildProgress
from shardstream.shard_builder.result import (
    BadInput,
    BuildResult,
    completed_result,
    existing_result,
    finish_build,
)
from shardstream.shard_builder.sink import ShardSink
from shardstream.shard_builder.workers import ordered_map

IMPORTER_VERSION = 1
_SHARD_OVERHEAD = 4096  # header + config JSON, an upper bound


@dataclass(frozen=True, kw_only=True)
class ImportConfig(OutputOptions):
    """Options of ``shardstream import FORMAT SOURCE...``.

    ``format`` is one of :data:`FORMATS`; ``inputs`` are files, folders or (per format)
    patterns such as WebDataset's ``shard-{000000..000099}.tar``. ``skip_bad`` leaves out
    samples whose columns differ from the schema (reported in ``shardstream.json``).

    Example::

        cfg = ImportConfig(format="webdataset", inputs=("data/shard-{0000..0009}.tar",),
                           output="out/")
    """

    format: str = ""
    inputs: tuple[str, ...] = ()
    skip_bad: bool = False
    value_format: str = "raw"
    allow_pickle: bool = False
    split: str = "train"
    seq_len: int | None = None

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
        if self.value_format != "raw" and self.format != "lmdb":
            raise ConfigError("value-format applies to lmdb imports only")


@dataclass(frozen=True)
class _Task:
    format: str
    unit: SourceUnit
    skip: int
    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Done:
    numbers: list[int]  # record number within the unit of each sample
    samples: list[bytes]
    bad: list[BadInput]
    records: int


def _schema_of(sample: dict[str, tuple[str, Any]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, enc) for name, (enc, _) in sample.items()))


def _schema_text(schema: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{n}:{e}" for n, e in schema)


def _read_unit(task: _Task) -> _Done:
    """Worker: read one unit, check every sample against the schema, encode it."""
    encode = make_encoder(dict(task.columns))
    done = _Done([], [], [], 0)
    number = -1
    for number, (where, sample) in enumerate(get_format(task.format).read(task.unit)):
        if number < task.skip:
            continue
        schema = _schema_of(sample)
        if schema != task.columns:
            reason = f"columns {_schema_text(schema)}; expected {_schema_text(task.columns)}"
            done.bad.append(BadInput(where, reason))
            continue
        try:
            encoded = encode({name: value for name, (_, value) in sample.items()})
        except InputError as exc:
            done.bad.append(BadInput(where, str(exc)))
            continue
        done.numbers.append(number)
        done.samples.append(encoded)
    return _Done(done.numbers, done.samples, done.bad, number + 1)


def _infer_columns(fmt: str, units: list[SourceUnit]) -> tuple[tuple[str, str], ...]:
    for unit in units:
        for _, sample in get_format(fmt).read(unit):
            return _schema_of(sample)
    raise InputError(f"no samples in {', '.join(u.path for u in units[:3])}")


class _Packer:
    """Greedy packing of encoded samples into shards of at most ``shard_size`` bytes."""

    def __init__(
        self,
        sink: ShardSink,
        *,
        journal: BuildJournal,
        config: ImportConfig,
        columns: dict[str, str],
        done: list[ShardInfo],
        skipped: list[BadInput],
    ) -> None:
        self.shards, self.skipped = done, skipped
        self._sink, self._journal, self._config, self._columns = sink, journal, config, columns
        self._pending: list[bytes] = []
        self._bytes = _SHARD_OVERHEAD

    def add(self, position: tuple[int, int], sample: bytes) -> None:
        if self._pending and self._bytes + len(sample) + 4 > self._config.shard_size:
            self.close_shard(position)
        self._pending.append(sample)
        self._bytes += len(sample) + 4

    def close_shard(self, next_position: tuple[int, int], *, final: bool = False) -> None:
        if not self._pending:
            return
        position, cfg = len(self.shards), self._config
        info = write_shard(
            self._sink.staging,
            shard_key(position, cfg.spread_prefixes),
            self._columns,
            self._pending,
            compression=cfg.compression,
            hashes=cfg.hashes,
            size_limit=cfg.shard_size,
        )
        self.shards.append(info)
        state = {
            "next": list(next_position),
            "final": final,
            "skipped": [asdict(b) for b in self.skipped],
        }
        self._sink.stored(info, lambda: self._journal.record(position, info, state))
        self._pending, self._bytes = [], _SHARD_OVERHEAD


def build_import(config: ImportConfig) -> BuildResult:
    """Import ``config.inputs`` in ``config.format`` into MDS shards at ``config.output``.

    Raises :class:`InputError` for unreadable input (naming the file and record) and,
    without ``skip_bad``, for a sample whose columns differ from the first sample's.
    """
    started = time.perf_counter()
    fmt = get_format(config.format)
    option = {"lmdb": config.value_format, "litdata": str(config.seq_len or "")}.get(
        config.format, config.split
    )
    units = [replace(u, option=option) for u in fmt.plan(config.inputs, option)]
    if not units:
        raise InputError(f"import {config.format}: no input files in {', '.join(config.inputs)}")
    lineage = [u.lineage() for u in units]
    options = content_options(config)
    fp = fingerprint({"importer": IMPORTER_VERSION, "options": options, "lineage": lineage})
    sink = ShardSink(config.output)
    try:
        if config.overwrite:
            sink.check_empty(overwrite=True)
        elif (done_result := existing_result(sink, fp)) is not None:
            return done_result
        columns = _infer_columns(config.format, units)
        journal = BuildJournal(sink, fp)
        finished = journal.start()
        resume = finished[-1].resume if finished else {}
        skipped = [BadInput(**b) for b in resume.get("skipped", [])]
        start_unit, start_record = resume.get("next", [0, 0])
        packer = _Packer(
            sink,
            journal=journal,
            config=config,
            columns=dict(columns),
            done=[d.info for d in finished],
            skipped=skipped,
        )
        total = sum(u.nbytes for u in units)
        with BuildProgress(total, desc=f"import {config.format}", enabled=config.progress) as bar:
            if not resume.get("final"):
                bar.skip(sum(u.nbytes for u in units[:start_unit]))
                tasks = [
                    _Task(config.format, u, start_record if i == start_unit else 0, columns)
                    for i, u in enumerate(units)
                    if i >= start_unit
                ]
                results = ordered_map(_read_unit, tasks, workers=config.workers)
                for i, (task, done) in enumerate(zip(tasks, results, strict=True), start_unit):
                    if done.bad and not config.skip_bad:
                        raise _bad_error(done.bad)
                    skipped.extend(done.bad)
                    for number, sample in zip(done.numbers, done.samples, strict=True):
                        packer.add((i, number), sample)
                    bar.advance(task.unit.nbytes, len(done.samples), sum(map(len, done.samples)))
                packer.close_shard((len(units), 0), final=True)
            if not packer.shards:
                raise InputError(f"no importable samples ({len(skipped)} skipped)")
            sink.flush()
        samples = sum(s.samples for s in packer.shards)
        metadata: dict[str, Any] = {
            "kind": "import",
            "format": config.format,
            "fingerprint": fp,
            "columns": dict(columns),
            "samples": samples,
            "records_in": samples + len(skipped),
            "skipped": [asdict(b) for b in skipped],
            "config": options,
            "lineage": lineage,
            **(fmt.describe(units) if fmt.describe else {}),
        }
        index = finish_build(sink, packer.shards, metadata)
        journal.clear()
    except InputError:
        sink.discard_partial()
        raise
    finally:
        sink.close()
    return completed_result(
        sink, index, metadata, config=config, reused_shards=len(finished), started=started
    )


def _bad_error(bad: list[BadInput]) -> InputError:
    shown = "; ".join(f"{b.source}: {b.reason}" for b in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return InputError(
        f"{len(bad)} sample(s) cannot be imported: {shown}{more}; fix the input or pass "
        "--skip-bad to leave them out (they are then listed in shardstream.json)"
    )
