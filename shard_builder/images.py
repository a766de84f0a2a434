"""``build_images``: an image folder or Parquet files -> ``{image, label}`` MDS shards.

Worker processes read and check chunks of images in parallel (decoding each once, see
:mod:`.image_codec`) and return the encoded samples in input order; the image kind's cut
packs them greedily by size into shards of at most ``shard_size`` bytes, which are written
with the codec's ``write_shard``. Greedy packing restarts at every shard boundary, so a
resumed build that continues after its last finished shard produces the same shards as an
uninterrupted one. The cut sees only the samples' sizes, so a Ray build makes it too
(:mod:`.cluster.driver`). The rest (ordered workers, journal, progress, index) is the
builder's one pipeline (:mod:`.pipeline`); this module supplies the image kind
(:class:`ImageKind`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from shardstream.errors import InputError
from shardstream.mds import make_encoder
from shardstream.shard_builder.config import ImageBuildConfig, content_options
from shardstream.shard_builder.cut import Counted, CutKind, CutShard, ShardLayout
from shardstream.shard_builder.image_codec import BadImageError, check_image, column_encoding
from shardstream.shard_builder.image_source import (
    ImageChunk,
    ImageSource,
    Item,
    plan_images,
    read_items,
)
from shardstream.shard_builder.journal import fingerprint
from shardstream.shard_builder.packing import Piece, greedy_cut
from shardstream.shard_builder.pipeline import BuildRun, run_build
from shardstream.shard_builder.result import BadInput, BuildResult

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
class ImageCount:
    """What the cut needs of a checked chunk (all a Ray driver gets of it): item numbers,
    sample sizes, bad images."""

    numbers: list[int]
    sizes: list[int]
    bad: list[tuple[int, BadInput]]


@dataclass(frozen=True)
class CheckedImages:
    """A chunk's good samples (encoded, with their item numbers) and its bad images."""

    numbers: list[int]
    samples: list[bytes]
    bad: list[tuple[int, BadInput]]

    @property
    def items(self) -> int:
        """Good images in the chunk."""
        return len(self.samples)

    @property
    def payload(self) -> list[bytes]:
        """What shards take pieces of: the samples."""
        return self.samples

    def count(self) -> ImageCount:
        """What the cut needs."""
        return ImageCount(self.numbers, [len(s) for s in self.samples], self.bad)


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
    """The image column's encoding: ``png`` when every image is a PNG, else ``jpeg``.

    Never ``bytes`` by default: a ``bytes`` column is handed to readers undecoded, and a
    tree with one PNG among its JPEGs would then reach torchvision as raw bytes. Every
    stored image passed :func:`check_image` (Pillow decodes it), and both readers decode
    a ``jpeg``/``png`` value by its content (ours by its magic bytes, MosaicML's through
    ``Image.open``), so a mixed tree goes in a ``jpeg`` column, each image keeping its own
    bytes.
    """
    if config.image_format != "auto":
        return config.image_format
    if source.extensions:
        return "png" if source.extensions == {".png"} else "jpeg"
    first = next((item for chunk in source.chunks for item in read_items(chunk)), None)
    return column_encoding(first[2] if first else None)


def undecoded_note(columns: dict[str, str]) -> list[str]:
    """The summary's word on an image column stored as ``bytes``: readers get it undecoded."""
    if columns.get("image") != "bytes":
        return []
    return [
        "column 'image' is stored as bytes (--image-format bytes): readers get the images "
        "undecoded; build with --image-format auto (or jpeg/png) to have them decoded"
    ]


def build_images(config: ImageBuildConfig) -> BuildResult:
    """Shard ``config.inputs`` (a class-per-folder tree or Parquet) as ``{image, label}``.

    Raises :class:`InputError` for unreadable input and, with ``on_bad_image="fail"``,
    for the first chunk holding undecodable images (naming their paths or rows).

    Example::

        result = build_images(ImageBuildConfig(output="out", inputs=("imagenet/train",)))
        print(result.label_names[:3], result.samples)
    """
    return run_build(ImageKind(config))


class ImageKind(CutKind):
    """An image build for :func:`~.pipeline.run_build`: its source is the chunks of an
    image folder or Parquet files (or a Ray dataset's blocks), its encoder checks each
    image, its cut packs the samples greedily by size (:class:`~.packing.GreedyCut`).

    Journal records hold the item a resume starts at and the bad images before it;
    ``skipped`` (item, bad input) ends in ``shardstream.json``.
    """

    desc = "build images"
    config: ImageBuildConfig

    def __init__(self, config: ImageBuildConfig, source: ImageSource | None = None) -> None:
        super().__init__(config)
        self.source = source or plan_images(config.inputs, config.image_field, config.label_field)
        self.columns = {"image": _image_encoding(config, self.source), "label": "int"}
        self.layout = ShardLayout(self.columns)
        self._fingerprint = fingerprint(
            {
                "builder": BUILDER_VERSION,
                "options": content_options(config),
                "lineage": self.source.lineage,
                "columns": self.columns,
            }
        )
        self.skipped: list[tuple[int, BadInput]] = []
        self.next_item = 0  # where this run starts

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    @property
    def units(self) -> Sequence[ImageChunk]:
        return self.source.chunks

    @property
    def end_item(self) -> int:
        """The number after the last item of the input."""
        last = self.source.chunks[-1]
        return last.first + last.count

    def start(self, run: BuildRun) -> int:
        resume = run.resume
        self.skipped = [
            (int(b["item"]), BadInput(b["source"], b["reason"])) for b in resume.get("skipped", [])
        ]
        self.next_item = int(resume.get("next_item", 0))
        self._cut = greedy_cut(self.columns, self.config)
        self._open: list[Piece] = []  # the open shard: samples [start, end) of chunks
        chunks = self.source.chunks
        return next(
            (i for i, c in enumerate(chunks) if c.first + c.count > self.next_item), len(chunks)
        )

    def task(self, number: int, unit: ImageChunk) -> ImageTask:
        config = self.config
        return ImageTask(
            unit,
            max(0, self.next_item - unit.first),
            tuple(self.columns.items()),
            config.resize,
            config.jpeg_quality,
            config.verify_images,
        )

    work = staticmethod(process_chunk)

    def take_bad(self, bad: list[tuple[int, BadInput]]) -> None:
        """A chunk's undecodable images: the build's error, or left out and listed."""
        if bad and self.config.on_bad_image == "fail":
            raise bad_images_error([b for _, b in bad])
        self.skipped.extend(bad)

    def cut(self, number: int, count: ImageCount) -> Counted:
        self.take_bad(count.bad)
        closed = []
        for i, (item, size) in enumerate(zip(count.numbers, count.sizes, strict=True)):
            if self._cut.add(size) and (shard := self._close(item)) is not None:
                closed.append(shard)
            if self._open and self._open[-1].chunk == number:
                self._open[-1] = Piece(number, self._open[-1].start, i + 1)
            else:
                self._open.append(Piece(number, i, i + 1))
        sizes = count.sizes
        return Counted(closed, len(sizes), sum(sizes), {"bad_images": len(count.bad)})

    def cut_last(self) -> CutShard | None:
        return self._close(self.end_item, final=True)

    def needed(self, number: int) -> bool:
        return any(piece.chunk == number for piece in self._open)

    def _close(self, next_item: int, *, final: bool = False) -> CutShard | None:
        """The open shard, closed; ``next_item`` is where a resume starts."""
        if not self._open:
            return None
        shard = CutShard(tuple(self._open), self.state(next_item, final=final))
        self._open = []
        return shard

    def state(self, next_item: int, *, final: bool = False) -> dict[str, Any]:
        """A shard's journal record: where the next shard starts, the bad inputs before it."""
        bad = [{"item": n, **asdict(b)} for n, b in self.skipped if n < next_item]
        return {"next_item": next_item, "final": final, "skipped": bad}

    def empty_error(self) -> InputError:
        return InputError(
            f"no decodable images in {', '.join(self.config.inputs)} "
            f"({len(self.skipped)} left out as undecodable)"
        )

    def metadata(self, run: BuildRun) -> dict[str, Any]:
        return {
            "kind": "images",
            "fingerprint": self._fingerprint,
            "columns": self.columns,
            "label_names": list(self.source.label_names),
            "skipped": [asdict(b) for _, b in self.skipped],
            "config": content_options(self.config),
            "lineage": self.source.lineage,
            **({"notes": notes} if (notes := undecoded_note(self.columns)) else {}),
        }


def bad_images_error(bad: list[BadInput]) -> InputError:
    shown = "; ".join(f"{b.source}: {b.reason}" for b in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return InputError(
        f"{len(bad)} undecodable image(s): {shown}{more}; fix or remove them, or pass "
        "--on-bad-image skip to leave them out (they are then listed in shardstream.json)"
    )
