"""What a build returns, and the last step that makes a build visible.

``shardstream.json`` (dataset metadata: kind, columns, label names, tokenizer, counts,
config, lineage) is written beside the shards, then ``index.json`` - last, so an output
without ``index.json`` is never a finished dataset - and then the journal is deleted.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from shardstream.errors import ConfigError, ObjectNotFoundError
from shardstream.mds import MDSIndex, ShardInfo, load_index
from shardstream.shard_builder.config import OutputOptions, config_dict
from shardstream.shard_builder.journal import BuildJournal
from shardstream.shard_builder.sink import INDEX_KEY, METADATA_KEY, ShardSink

METADATA_FORMAT = 1


@dataclass(frozen=True)
class BadInput:
    """An input item left out of the build (``--on-bad-image skip``): where, and why."""

    source: str
    reason: str


@dataclass(frozen=True)
class WorkerStats:
    """What one worker of a distributed build did: ``name`` (node and process), work
    items, ``items`` (documents or images), input bytes, seconds busy (wall) and CPU
    seconds, shards written."""

    name: str
    chunks: int = 0
    items: int = 0
    input_bytes: int = 0
    busy_s: float = 0.0
    cpu_s: float = 0.0
    shards: int = 0
    written_bytes: int = 0

    def line(self, kind: str, total_s: float) -> str:
        """``worker 10.0.0.5 node 3fa2c1d0 pid 812: 1,200 documents/s, 3.1 MB/s in (...)``."""
        what = "documents" if kind == "text" else "images"
        secs = max(total_s, 1e-9)
        return (
            f"worker {self.name}: {self.items / secs:,.0f} {what}/s, "
            f"{self.input_bytes / (1 << 20) / secs:,.1f} MB/s in ({self.chunks} chunks), "
            f"{self.shards} shards ({self.written_bytes / (1 << 20):,.1f} MB) written, "
            f"busy {100 * self.busy_s / secs:.0f}%, {self.cpu_s:.1f} CPU s"
        )


@dataclass(frozen=True)
class BuildResult:
    """The outcome of a build.

    ``index`` is the MDS index written to ``output``; ``metadata`` is the content of
    ``shardstream.json`` (the content options only; ``config`` here is every option of this
    run). ``dropped_tokens`` is the final remainder shorter than a
    sequence (text). ``timings`` holds ``total_s``; ``reused_shards`` counts shards kept
    from an interrupted run. ``workers`` holds per-worker numbers of a Ray build.
    """

    kind: str
    output: str
    index: MDSIndex
    columns: dict[str, str]
    samples: int
    raw_bytes: int
    stored_bytes: int
    config: dict[str, Any]
    lineage: list[dict[str, Any]]
    metadata: dict[str, Any]
    dropped_tokens: int = 0
    tokens: int = 0
    documents: int = 0
    label_names: tuple[str, ...] = ()
    skipped: tuple[BadInput, ...] = ()
    reused_shards: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    workers: tuple[WorkerStats, ...] = ()

    @property
    def shards(self) -> list[ShardInfo]:
        """The shards in order."""
        return self.index.shards

    def summary(self) -> str:
        """One line for the CLI."""
        mb = self.raw_bytes / (1 << 20)
        text = (
            f"{self.samples:,} samples in {len(self.shards)} shards ({mb:,.1f} MB) -> {self.output}"
        )
        secs = self.timings.get("total_s")
        if secs is None:  # found finished in the output: nothing was built
            text += " (already built: nothing to do)"
        else:
            secs = max(secs, 1e-9)
            text += f" in {secs:.1f}s ({self.samples / secs:,.0f} samples/s, {mb / secs:,.1f} MB/s)"
        if self.kind == "text":
            text += f"; {self.tokens:,} tokens, {self.dropped_tokens} dropped at the end"
        skipped = int(self.metadata.get("skipped_count", len(self.skipped)))
        if skipped:
            text += f"; {skipped} bad inputs skipped"
            if skipped > len(self.skipped):  # a text build names the first few
                text += f" (the first {len(self.skipped)} named below)"
        if self.reused_shards and secs is not None:
            text += f"; {self.reused_shards} shards reused from an earlier run"
        for note in self.metadata.get("notes", []):  # what the build chose by default
            text += f"; {note}"
        return text


def finish_build(sink: ShardSink, shards: list[ShardInfo], metadata: dict[str, Any]) -> MDSIndex:
    """Write ``shardstream.json`` and then ``index.json`` into the output."""
    index = MDSIndex(shards=list(shards))
    metadata = {"format": METADATA_FORMAT, **metadata}
    sink.store.write_bytes(METADATA_KEY, json.dumps(metadata, indent=1, sort_keys=True).encode())
    sink.store.write_bytes(INDEX_KEY, index.to_json().encode("utf-8"))
    return index


def existing_result(sink: ShardSink, fingerprint: str) -> BuildResult | None:
    """The result of a finished build already in the output with this fingerprint.

    ``None`` when the output has no ``index.json``. Raises :class:`ConfigError` when it holds
    a finished dataset made from other inputs or options.
    """
    try:
        index_bytes = sink.store.read_bytes(INDEX_KEY)
    except ObjectNotFoundError:
        return None
    try:
        metadata = json.loads(sink.store.read_bytes(METADATA_KEY))
    except (ObjectNotFoundError, ValueError):
        metadata = {}
    if metadata.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"{sink.url} already holds a finished dataset made from other inputs or options; "
            "choose another output, or pass --overwrite to replace it"
        )
    # A run killed between writing index.json and deleting its journal left the journal.
    BuildJournal(sink, fingerprint).clear()
    return result_from_metadata(sink.url, load_index(index_bytes), metadata, reused=True)


def result_from_metadata(
    output: str, index: MDSIndex, metadata: dict[str, Any], *, reused: bool = False
) -> BuildResult:
    """Assemble a :class:`BuildResult` from an index and its ``shardstream.json`` content."""
    return BuildResult(
        kind=str(metadata.get("kind", "")),
        output=output,
        index=index,
        columns=dict(metadata.get("columns", {})),
        samples=index.num_samples,
        raw_bytes=sum(s.raw_data.bytes for s in index.shards),
        stored_bytes=sum(s.stored.bytes for s in index.shards),
        config=dict(metadata.get("config", {})),
        lineage=list(metadata.get("lineage", [])),
        metadata=metadata,
        dropped_tokens=int(metadata.get("dropped_tokens", 0)),
        tokens=int(metadata.get("tokens", 0)),
        documents=int(metadata.get("documents", 0)),
        label_names=tuple(metadata.get("label_names", ())),
        skipped=tuple(BadInput(**b) for b in metadata.get("skipped", ())),
        reused_shards=len(index.shards) if reused else 0,
    )


def completed_result(
    sink: ShardSink,
    index: MDSIndex,
    metadata: dict[str, Any],
    *,
    config: OutputOptions,
    reused_shards: int,
    started: float,
) -> BuildResult:
    """The result of a build that just finished (``started``: its ``perf_counter``)."""
    result = result_from_metadata(sink.url, index, metadata)
    timings = {"total_s": time.perf_counter() - started}
    return replace(result, config=config_dict(config), reused_shards=reused_shards, timings=timings)
