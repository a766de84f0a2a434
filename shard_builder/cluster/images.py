"""``build_images`` on a Ray cluster: the same shards, checked and written by the workers.

The image kind of the builder's one pipeline, its ordered workers on actors (the one Ray
driver, :mod:`.driver`; as for text, see :mod:`.text`): actors check chunks of images and
keep the encoded samples in their node's object store; the driver gets each chunk's sample
sizes and bad images, in chunk order, applies the image kind's own cut to them (greedy by
size, as a local build), and has the actor holding most of a shard's samples write and
upload it. The worker journals each
shard before putting it in place, so a killed build resumes after its last stored shard
of the unbroken run and takes the later shards it finds recorded as they are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import (
    check_block_images,
    image_source,
    is_url,
    url_inputs,
)
from shardstream.shard_builder.cluster.driver import build_on_pool
from shardstream.shard_builder.config import ImageBuildConfig
from shardstream.shard_builder.image_source import PARQUET_SUFFIXES
from shardstream.shard_builder.images import ImageKind
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

        # A dataset's units are blocks in the object store: the actors read them there.
        work = check_block_images if source is not None else None
        return build_on_pool(ray_module, config, options, lambda: ImageKind(config, source), work)
