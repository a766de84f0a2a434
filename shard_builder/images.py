"""``build_images``: an image folder or Parquet files -> ``{image, label}`` MDS shards.

Worker processes read and check chunks of images in parallel (decoding each once, see
:mod:`.image_codec`) and return the encoded samples in input order; this process packs
them greedily into shards of at most ``shard_size`` bytes and writes each with the codec's
``write_shard``. Greedy packing restarts at every shard boundary, so a resumed build that
continues after its last finished shard produces the same shards as an uninterrupted one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from shardstream.errors import InputError
from shardstream.mds import ShardInfo, make_encoder, shard_config, write_shard
from shardstream.shard_builder.config import ImageBuildConfig, content_options
from shardstream.shard_builder.image_codec import BadImageError, check_image, sniff_format
from shardstream.shard_builder.image_source import (
    ImageChunk,
    ImageSource,
    Item,
    plan_images,
    read_items,
)
from shardstream.shard_builder.journal import BuildJournal, fingerprint, shard_key
from shardstream.shard_builder.packing import GreedyCut
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

BUILDER_VERSION = 1


@dataclass(frozen=True)
class ImageTask:
    """One unit of work: a chunk of images from its item ``skip`` on, and how to check them."""

    chunk: ImageChunk
    skip: int
    columns: tuple[tuple[str, str], ...]
    resize: int | None
    jpeg_quality: int
    verify: str


@dataclass(frozen=True)
class CheckedImages:
    """A chunk's good samples (encoded, with their item numbers) and its bad images."""

    numbers: list[int]
    samples: list[bytes]
    bad: list[tuple[int, BadInput]]


def process_chunk(task: ImageTask, items: Iterable[Item] | None = None) -> CheckedImages:
    """Worker: read, check (and maybe resize) the chunk's images; encode the samples.

    ``items`` replaces reading the chunk's files (the Ray builder passes a block's rows).
    """
    encode = make_encoder(dict(task.columns))
    done = CheckedImages([], [], [])
    for number, source, data, label in (
        items if items is not None else read_items(task.chunk, task.skip)
    ):
        try:
            if data is None:
                raise BadImageError("the image value is null")
            image = check_image(
                data, resize=task.resize, jpeg_quality=task.jpeg_quality, verify=task.verify
            )
        except BadImageError as exc:
            done.bad.append((number, BadInput(source, str(exc))))
            continue
        done.numbers.append(number)
        done.samples.append(encode({"image": image, "label": label}))
    return done


def _image_encoding(config: ImageBuildConfig, source: ImageSource) -> str:
    if config.image_format != "auto":
        return config.image_format
    if source.extensions:
        if source.extensions <= {".jpg", ".jpeg"}:
            return "jpeg"
        return "png" if source.extensions == {".png"} else "bytes"
    first = next((item for chunk in source.chunks for item in read_items(chunk)), None)
    return sniff_format(first[2] or b"") if first else "bytes"


def shard_header_bytes(columns: dict[str, str], config: ImageBuildConfig) -> int:
    """A shard's bytes before its samples: count, one offset more, config JSON."""
    template = shard_config(
        columns, compression=config.compression, hashes=config.hashes, size_limit=config.shard_size
    )
    # Shard file = count + offsets (4 bytes per sample, plus one) + config JSON + samples.
    return 8 + len(json.dumps(template.config(), sort_keys=True))


def shard_state(
    skipped: list[tuple[int, BadInput]], next_item: int, *, final: bool
) -> dict[str, Any]:
    """A shard's journal record: where the next shard starts, the bad inputs before it."""
    bad = [{"item": n, **asdict(b)} for n, b in skipped if n < next_item]
    return {"next_item": next_item, "final": final, "skipped": bad}


class _GreedyShards:
    """Packs encoded samples, in order, into shards of at most ``shard_size`` bytes."""

    def __init__(
        self,
        sink: ShardSink,
        *,
        journal: BuildJournal,
        columns: dict[str, str],
        config: ImageBuildConfig,
        done: list[ShardInfo],
        skipped: list[tuple[int, BadInput]],
    ) -> None:
        self.shards = done
        self.skipped = skipped
        self._sink, self._journal, self._columns = sink, journal, columns
        self._config = config
        self._cut = GreedyCut(shard_header_bytes(columns, config), config.shard_size)
        self._pending: list[bytes] = []

    def add(self, number: int, sample: bytes) -> None:
        """Append item ``number``'s sample, first closing the shard if it would overflow."""
        if self._cut.add(len(sample)):
            self.close_shard(number)
        self._pending.append(sample)

    def close_shard(self, next_item: int, *, final: bool = False) -> None:
        """Write the pending samples as the next shard; ``next_item`` is where a resume starts."""
        if not self._pending:
            return
        position = len(self.shards)
        state = shard_state(self.skipped, next_item, final=final)
        pending = self._pending
        info = self._journal.take_or_store(
            position,
            state,
            lambda: write_shard(
                self._sink.staging,
                shard_key(position, self._config.spread_prefixes),
                self._columns,
                pending,
                **self._config.shard_format(),
            ),
        )
        self.shards.append(info)
        self._pending = []


def _tasks(
    config: ImageBuildConfig, source: ImageSource, columns: dict[str, str], next_item: int
) -> list[ImageTask]:
    """Work items for the chunks from item ``next_item`` on."""
    return [
        ImageTask(
            chunk,
            max(0, next_item - chunk.first),
            tuple(columns.items()),
            config.resize,
            config.jpeg_quality,
            config.verify_images,
        )
        for chunk in source.chunks
        if chunk.first + chunk.count > next_item
    ]


@dataclass
class ImageJob:
    """The middle of an image build: what a producer of shards is given.

    A producer checks the images of ``tasks`` (the chunks from ``next_item`` on), packs
    them with :class:`GreedyCut` into shards after ``shards`` (the finished ones), stores
    each, records it in ``journal`` in shard order, adds undecodable images to ``skipped``
    and moves ``progress``.
    """

    config: ImageBuildConfig
    source: ImageSource
    columns: dict[str, str]
    tasks: list[ImageTask]
    sink: ShardSink
    journal: BuildJournal
    shards: list[ShardInfo]
    skipped: list[tuple[int, BadInput]]
    progress: BuildProgress

    @property
    def end_item(self) -> int:
        """The number after the last item of the input."""
        last = self.source.chunks[-1]
        return last.first + last.count


ImageProducer = Callable[[ImageJob], None]


def build_images(config: ImageBuildConfig) -> BuildResult:
    """Shard ``config.inputs`` (a class-per-folder tree or Parquet) as ``{image, label}``.

    Raises :class:`InputError` for unreadable input and, with ``on_bad_image="fail"``,
    for the first chunk holding undecodable images (naming their paths or rows).

    Example::

        result = build_images(ImageBuildConfig(output="out", inputs=("imagenet/train",)))
        print(result.label_names[:3], result.samples)
    """
    return run_image_build(config, _produce_locally)


def run_image_build(
    config: ImageBuildConfig, produce: ImageProducer, source: ImageSource | None = None
) -> BuildResult:
    """Everything of an image build but checking images and writing shards (``produce``).

    ``source`` is what is read (default: the folder or Parquet files of ``config.inputs``).
    """
    started = time.perf_counter()
    source = source or plan_images(config.inputs, config.image_field, config.label_field)
    columns = {"image": _image_encoding(config, source), "label": "int"}
    lineage = source.lineage
    fp = fingerprint(
        {
            "builder": BUILDER_VERSION,
            "options": content_options(config),
            "lineage": lineage,
            "columns": columns,
        }
    )
    sink = ShardSink(config.output)
    try:
        if config.overwrite:
            sink.check_empty(overwrite=True)
        elif (done_result := existing_result(sink, fp)) is not None:
            return done_result
        journal = BuildJournal(sink, fp)
        finished = journal.start()
        resume = finished[-1].resume if finished else {}
        skipped = [
            (int(b["item"]), BadInput(b["source"], b["reason"])) for b in resume.get("skipped", [])
        ]
        progress = BuildProgress(
            sum(c.nbytes for c in source.chunks), desc="build images", enabled=config.progress
        )
        job = ImageJob(
            config=config,
            source=source,
            columns=columns,
            tasks=_tasks(config, source, columns, int(resume.get("next_item", 0))),
            sink=sink,
            journal=journal,
            shards=[d.info for d in finished],
            skipped=skipped,
            progress=progress,
        )
        with progress:
            if not resume.get("final"):
                progress.skip(
                    sum(c.nbytes for c in source.chunks) - sum(t.chunk.nbytes for t in job.tasks)
                )
                produce(job)
                if not job.shards:
                    raise InputError(
                        f"no decodable images in {', '.join(config.inputs)} "
                        f"({len(skipped)} left out as undecodable)"
                    )
            sink.flush()
        metadata: dict[str, Any] = {
            "kind": "images",
            "fingerprint": fp,
            "columns": columns,
            "label_names": list(source.label_names),
            "skipped": [asdict(b) for _, b in skipped],
            "config": content_options(config),
            "lineage": lineage,
        }
        index = finish_build(sink, job.shards, metadata)
        journal.clear()
    except InputError:
        sink.discard_partial()  # fixing the input changes it: nothing here can be reused
        raise
    finally:
        sink.close()
    return completed_result(
        sink,
        index,
        metadata,
        config=config,
        reused_shards=len(finished) + journal.reused_later,
        started=started,
    )


def _produce_locally(job: ImageJob) -> None:
    """Check images in worker processes (results in chunk order), write shards here."""
    config = job.config
    packer = _GreedyShards(
        job.sink,
        journal=job.journal,
        columns=job.columns,
        config=config,
        done=job.shards,
        skipped=job.skipped,
    )
    results = ordered_map(process_chunk, job.tasks, workers=config.workers)
    for task, processed in zip(job.tasks, results, strict=True):
        if processed.bad and config.on_bad_image == "fail":
            raise bad_images_error([b for _, b in processed.bad])
        job.skipped.extend(processed.bad)
        for number, sample in zip(processed.numbers, processed.samples, strict=True):
            packer.add(number, sample)
        made = sum(map(len, processed.samples))
        job.progress.advance(task.chunk.nbytes, len(processed.samples), made)
    packer.close_shard(job.end_item, final=True)


def bad_images_error(bad: list[BadInput]) -> InputError:
    shown = "; ".join(f"{b.source}: {b.reason}" for b in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return InputError(
        f"{len(bad)} undecodable image(s): {shown}{more}; fix or remove them, or pass "
        "--on-bad-image skip to leave them out (they are then listed in shardstream.json)"
    )
