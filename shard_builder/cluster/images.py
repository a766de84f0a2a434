"""``build_images`` on a Ray cluster: the same shards, checked and written by the workers.

The image kind of the builder's one pipeline, its ordered workers on actors (:mod:`.driver`;
as for text, see :mod:`.text`): actors check chunks of images and keep the encoded
samples in their node's object store; the driver gets each chunk's sample sizes and bad
images, in chunk order, packs them with the local builder's :class:`GreedyCut`, and has
the actor holding most of a shard's samples write and upload it. The worker journals each
shard before putting it in place, so a killed build resumes after its last stored shard
of the unbroken run and takes the later shards it finds recorded as they are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import image_source, is_url, url_inputs
from shardstream.shard_builder.cluster.driver import ActorDriver
from shardstream.shard_builder.cluster.pool import WorkerPool, build_on_pool
from shardstream.shard_builder.cluster.worker import ImageCount, SampleShard
from shardstream.shard_builder.config import ImageBuildConfig
from shardstream.shard_builder.image_source import PARQUET_SUFFIXES
from shardstream.shard_builder.images import ImageKind, shard_header_bytes
from shardstream.shard_builder.packing import GreedyCut
from shardstream.shard_builder.pipeline import BuildRun
from shardstream.shard_builder.result import BuildResult


def build_images_on_ray(
    config: ImageBuildConfig,
    ray: RayOptions | None = None,
    *,
    dataset: Any = None,
    lineage: list[dict[str, Any]] | None = None,
) -> BuildResult:
    """:func:`~shardstream.shard_builder.build_images` with Ray workers: byte-identical output.

    The input is ``config.inputs`` (a folder or Parquet files every node can read, or
    ``s3://`` Parquet files, which Ray Data reads), or
    ``dataset``: a ``ray.data.Dataset`` with ``config.image_field`` (bytes, or a
    ``{bytes, path}`` struct) and an integer ``config.label_field``, in order
    (``config.inputs`` then only names it; ``lineage`` describes its source).
    ``ray.workers`` (default: every CPU of the cluster) sets the number of worker actors;
    ``config.workers`` is ignored. The result's ``workers`` holds each actor's numbers.
    """
    options = ray or RayOptions()

    with ray_session(options) as ray_module:
        source = None
        if dataset is None and any(is_url(name) for name in config.inputs):
            lineage = url_inputs(config.inputs, PARQUET_SUFFIXES)  # image Parquet, read by Ray
            dataset = ray_module.data.read_parquet([o["url"] for o in lineage])
        if dataset is not None:
            source, encoding = image_source(ray_module, dataset, config, lineage)
            config = replace(config, image_format=encoding)  # type: ignore[arg-type]

        return build_on_pool(ray_module, config, options, lambda: ImageKind(config, source), _drive)


def _drive(kind: ImageKind, run: BuildRun, pool: WorkerPool) -> None:
    _ImageDriver(kind, run, pool).drive()


class _ImageDriver(ActorDriver):
    """Images on actors: they check chunks; the driver packs the sample sizes with the
    local builder's :class:`GreedyCut`."""

    def __init__(self, kind: ImageKind, run: BuildRun, pool: WorkerPool) -> None:
        super().__init__(run, pool, len(kind.units))
        self.kind = kind
        self.cut = GreedyCut(shard_header_bytes(kind.columns, kind.config), kind.config.shard_size)
        self.ranges: list[tuple[int, int, int]] = []  # the open shard: (unit, start, end)

    def call(self, number: int) -> tuple[str, tuple[Any, ...]]:
        return "check_images", (self.kind.task(number, self.kind.units[number]),)

    def counted(self, number: int, count: ImageCount) -> None:
        self.kind.take_bad(count.bad)
        for i, (item, size) in enumerate(zip(count.numbers, count.sizes, strict=True)):
            if self.cut.add(size):
                self._close(item)
            if self.ranges and self.ranges[-1][0] == number:
                self.ranges[-1] = (number, self.ranges[-1][1], i + 1)
            else:
                self.ranges.append((number, i, i + 1))
        needed = {unit for unit, _, _ in self.ranges}
        self.release(needed.__contains__)  # every sample of the others is in a shard
        self.run.progress.advance(
            self.kind.units[number].nbytes,
            len(count.sizes),
            sum(count.sizes),
            bad_images=len(count.bad),
        )

    def finish(self) -> None:
        self._close(self.kind.end_item, final=True)

    def _close(self, next_item: int, *, final: bool = False) -> None:
        """Have the open shard written; ``next_item`` is where a resume would start."""
        if not self.ranges:
            return
        state = self.kind.state(next_item, final=final)
        shares = {unit: end - start for unit, start, end in self.ranges}
        ranges = tuple((start, end) for _, start, end in self.ranges)
        shard = SampleShard(self.next_position, ranges, self.kind.columns, state)
        self.write(state, shares, "write_samples", shard)
        self.ranges = []
