"""``build_images`` on a Ray cluster: the same shards, checked and written by the workers.

As for text (see :mod:`.text`): actors check chunks of images and keep the encoded
samples in their node's object store; the driver gets each chunk's sample sizes and bad
images, in chunk order, packs them with the local builder's :class:`GreedyCut`, and has
the actor holding most of a shard's samples write and upload it. The worker journals each
shard before putting it in place, so a killed build resumes after its last stored shard
of the unbroken run and takes the later shards it finds recorded as they are.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

from shardstream.mds import ShardInfo
from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import image_source, is_url, url_inputs
from shardstream.shard_builder.cluster.pool import WorkerPool, build_on_pool
from shardstream.shard_builder.cluster.worker import ImageCount, SampleShard
from shardstream.shard_builder.config import ImageBuildConfig
from shardstream.shard_builder.image_source import PARQUET_SUFFIXES
from shardstream.shard_builder.images import (
    ImageJob,
    bad_images_error,
    run_image_build,
    shard_header_bytes,
    shard_state,
)
from shardstream.shard_builder.packing import GreedyCut
from shardstream.shard_builder.result import BuildResult

_MB = 1 << 20


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

        return build_on_pool(
            ray_module,
            config,
            options,
            lambda produce: run_image_build(config, produce, source),
            _drive,
        )


def _drive(job: ImageJob, pool: WorkerPool) -> None:
    return _Run(job, pool).run()


@dataclass
class _Write:
    position: int
    ref: Any  # the worker's ShardInfo, or None: a shard a killed run stored (``info``)
    info: ShardInfo | None = None


class _Run:
    """One image build's driver loop."""

    def __init__(self, job: ImageJob, pool: WorkerPool) -> None:
        self.job = job
        self.pool = pool
        self.window = 2 * len(pool)
        self.cut = GreedyCut(shard_header_bytes(job.columns, job.config), job.config.shard_size)
        self.checking: dict[int, tuple[Any, Any, int]] = {}  # task -> sizes, samples, actor
        self.samples: dict[int, tuple[Any, int]] = {}  # checked tasks a shard still needs
        self.ranges: list[tuple[int, int, int]] = []  # the open shard: (task, start, end)
        self.writes: deque[_Write] = deque()

    def run(self) -> None:
        tasks = self.job.tasks
        next_submit = next_count = 0
        while next_count < len(tasks):
            while next_submit < len(tasks) and next_submit - next_count < self.window:
                actor = self.pool.least_busy()
                sizes, samples = self.pool.submit(
                    actor, "check_images", tasks[next_submit], num_returns=2
                )
                self.checking[next_submit] = (sizes, samples, actor)
                next_submit += 1
            if len(self.writes) >= self.window:
                self._wait_head()
                continue
            sizes_ref = self.checking[next_count][0]
            heads = [sizes_ref] + [w.ref for w in list(self.writes)[:1] if w.ref is not None]
            ready = self.pool.wait_any(heads)
            self._record_stored(ready)
            if sizes_ref in ready:
                self._count(next_count)
                next_count += 1
        self._close(self.job.end_item, final=True)
        while self.writes:
            self._wait_head()

    def _count(self, task: int) -> None:
        sizes_ref, samples_ref, actor = self.checking.pop(task)
        counted: ImageCount = self.pool.get(sizes_ref)
        if counted.bad and self.job.config.on_bad_image == "fail":
            raise bad_images_error([b for _, b in counted.bad])
        self.job.skipped.extend(counted.bad)
        self.samples[task] = (samples_ref, actor)
        for i, (number, size) in enumerate(zip(counted.numbers, counted.sizes, strict=True)):
            if self.cut.add(size):
                self._close(number)
            if self.ranges and self.ranges[-1][0] == task:
                self.ranges[-1] = (task, self.ranges[-1][1], i + 1)
            else:
                self.ranges.append((task, i, i + 1))
        needed = {t for t, _, _ in self.ranges}
        for done in [t for t in self.samples if t not in needed]:
            del self.samples[done]  # every sample of it is in a shard: Ray frees them
        self.job.progress.advance(
            self.job.tasks[task].chunk.nbytes,
            len(counted.sizes),
            sum(counted.sizes),
            bad_images=len(counted.bad),
        )

    def _close(self, next_item: int, *, final: bool = False) -> None:
        """Have the open shard written; ``next_item`` is where a resume would start."""
        if not self.ranges:
            return
        position = len(self.job.shards) + len(self.writes)
        state = shard_state(self.job.skipped, next_item, final=final)
        if (stored := self.job.journal.reusable(position, state)) is not None:
            self.writes.append(_Write(position, None, stored))  # a killed run stored it
            self.ranges = []
            return
        held: dict[int, int] = {}
        for task, start, end in self.ranges:
            owner = self.samples[task][1]
            held[owner] = held.get(owner, 0) + end - start
        ranges = tuple((start, end) for _, start, end in self.ranges)
        ref = self.pool.submit(
            max(held, key=held.__getitem__),
            "write_samples",
            SampleShard(position, ranges, self.job.columns, state),
            *(self.samples[task][0] for task, _, _ in self.ranges),
        )
        self.writes.append(_Write(position, ref))
        self.ranges = []

    def _wait_head(self) -> None:
        """Wait for the shard at the head of the queue, then take what is stored."""
        head = self.writes[0].ref
        self._record_stored(set() if head is None else self.pool.wait_any([head]))

    def _record_stored(self, ready: set[Any]) -> None:
        """Take the stored (and journaled) shards at the head of the queue, in shard order."""
        while self.writes and (
            self.writes[0].ref is None
            or self.writes[0].ref in ready
            or self.pool.wait_any([self.writes[0].ref], timeout=0)
        ):
            write = self.writes.popleft()
            info = write.info if write.ref is None else self.pool.get(write.ref)
            assert info is not None and write.position == len(self.job.shards)
            self.job.shards.append(info)
            self.job.progress.count(shards=1, MB_written=info.stored.bytes / _MB)
