"""``build_images``: an image folder or Parquet files -> ``{image, label}`` MDS shards.

Worker processes read and check chunks of images in parallel (decoding each once, see
:mod:`.image_codec`) and return the encoded samples in input order; this process packs
them greedily into shards of at most ``shard_size`` bytes and writes each with the codec's
``write_shard``. Greedy packing restarts at every shard boundary, so a resumed build that
continues after its last finished shard produces the same shards as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from shardstream.errors import InputError
from shardstream.mds import ShardInfo, make_encoder, shard_config, write_shard
from shardstream.shard_builder.config import ImageBuildConfig, config_dict, content_options
from shardstream.shard_builder.image_codec import BadImageError, check_image, sniff_format
from shardstream.shard_builder.image_source import ImageChunk, ImageSource, plan_images, read_items
from shardstream.shard_builder.journal import BuildJournal, fingerprint, shard_basename
from shardstream.shard_builder.progress import BuildProgress
from shardstream.shard_builder.result import (
    BadInput,
    BuildResult,
    existing_result,
    finish_build,
    result_from_metadata,
)
from shardstream.shard_builder.sink import ShardSink
from shardstream.shard_builder.workers import ordered_map

BUILDER_VERSION = 1


@dataclass(frozen=True)
class _Task:
    chunk: ImageChunk
    skip: int
    columns: tuple[tuple[str, str], ...]
    resize: int | None
    jpeg_quality: int


@dataclass(frozen=True)
class _Done:
    numbers: list[int]
    samples: list[bytes]
    bad: list[tuple[int, BadInput]]


def _process_chunk(task: _Task) -> _Done:
    """Worker: read, check (and maybe resize) the chunk's images; encode the samples."""
    encode = make_encoder(dict(task.columns))
    done = _Done([], [], [])
    for number, source, data, label in read_items(task.chunk, task.skip):
        try:
            if data is None:
                raise BadImageError("the image value is null")
            image = check_image(data, resize=task.resize, jpeg_quality=task.jpeg_quality)
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


def _lineage(config: ImageBuildConfig, source: ImageSource) -> list[dict[str, Any]]:
    if not source.extensions:  # parquet: a handful of files, list them
        return [f.lineage() for f in source.files]
    # A folder can hold millions of files: record a digest of the listing, not the listing.
    listing = hashlib.sha256()
    for f in source.files:
        listing.update(f"{f.path}\0{f.size}\0{f.mtime_ns}\n".encode())
    return [
        {
            "path": str(config.inputs[0]),
            "files": len(source.files),
            "size": sum(f.size for f in source.files),
            "listing_sha256": listing.hexdigest(),
        }
    ]


def build_images(config: ImageBuildConfig) -> BuildResult:
    """Shard ``config.inputs`` (a class-per-folder tree or Parquet) as ``{image, label}``.

    Raises :class:`InputError` for unreadable input and, with ``on_bad_image="fail"``,
    for the first chunk holding undecodable images (naming their paths or rows).

    Example::

        result = build_images(ImageBuildConfig(output="out", inputs=("imagenet/train",)))
        print(result.label_names[:3], result.samples)
    """
    started = time.perf_counter()
    source = plan_images(config.inputs, config.image_field, config.label_field)
    columns = {"image": _image_encoding(config, source), "label": "int"}
    lineage = _lineage(config, source)
    fp = fingerprint(
        {
            "builder": BUILDER_VERSION,
            "options": content_options(config),
            "lineage": lineage,
            "columns": columns,
        }
    )
    template = shard_config(
        columns, compression=config.compression, hashes=config.hashes, size_limit=config.shard_size
    )
    header = 8 + len(json.dumps(template.config(), sort_keys=True))
    sink = ShardSink(config.output)
    try:
        if config.overwrite:
            sink.check_empty(overwrite=True)
        elif (done_result := existing_result(sink, fp)) is not None:
            return done_result
        journal = BuildJournal(sink, fp)
        finished = journal.start()
        shards: list[ShardInfo] = [d.info for d in finished]
        resume = finished[-1].resume if finished else {}
        next_item = int(resume.get("next_item", 0))
        skipped = [
            (int(b["item"]), BadInput(b["source"], b["reason"])) for b in resume.get("skipped", [])
        ]
        pending: list[bytes] = []
        pending_bytes = header
        progress = BuildProgress(
            sum(c.nbytes for c in source.chunks), desc="build images", enabled=config.progress
        )

        def write(end_item: int, final: bool = False) -> None:
            position = len(shards)
            info = write_shard(
                sink.staging,
                shard_basename(position),
                columns,
                pending,
                compression=config.compression,
                hashes=config.hashes,
                size_limit=config.shard_size,
            )
            shards.append(info)
            bad = [{"item": n, **asdict(b)} for n, b in skipped if n < end_item]
            state = {"next_item": end_item, "final": final, "skipped": bad}
            sink.stored(info, lambda: journal.record(position, info, state))
            progress.shard_written(info.samples, info.raw_data.bytes)

        with progress:
            if not resume.get("final"):
                tasks = []
                for chunk in source.chunks:
                    if chunk.first + chunk.count <= next_item:
                        progress.advance(chunk.nbytes)
                        continue
                    skip = max(0, next_item - chunk.first)
                    tasks.append(
                        _Task(
                            chunk, skip, tuple(columns.items()), config.resize, config.jpeg_quality
                        )
                    )
                for task, processed in zip(
                    tasks, ordered_map(_process_chunk, tasks, workers=config.workers), strict=True
                ):
                    if processed.bad and config.on_bad_image == "fail":
                        raise _bad_images_error([b for _, b in processed.bad])
                    skipped.extend(processed.bad)
                    for number, sample in zip(processed.numbers, processed.samples, strict=True):
                        if pending and pending_bytes + len(sample) + 4 > config.shard_size:
                            write(number)
                            pending, pending_bytes = [], header
                        pending.append(sample)
                        pending_bytes += len(sample) + 4
                    progress.advance(task.chunk.nbytes)
                if not shards and not pending:
                    raise InputError(
                        f"no decodable images in {', '.join(config.inputs)} "
                        f"({len(skipped)} left out as undecodable)"
                    )
                if pending:
                    write(source.chunks[-1].first + source.chunks[-1].count, final=True)
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
        index = finish_build(sink, shards, metadata)
        journal.clear()
    except InputError:
        sink.discard_partial()  # fixing the input changes it: nothing here can be reused
        raise
    finally:
        sink.close()
    result = result_from_metadata(sink.url, index, metadata)
    timings = {"total_s": time.perf_counter() - started}
    return replace(result, config=config_dict(config), reused_shards=len(finished), timings=timings)


def _bad_images_error(bad: list[BadInput]) -> InputError:
    shown = "; ".join(f"{b.source}: {b.reason}" for b in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return InputError(
        f"{len(bad)} undecodable image(s): {shown}{more}; fix or remove them, or pass "
        "--on-bad-image skip to leave them out (they are then listed in shardstream.json)"
    )
