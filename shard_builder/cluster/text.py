"""``build_text`` on a Ray cluster: the same shards, tokenized and written by the workers.

The driver plans the chunks exactly as the local builder does (the same
:class:`~shardstream.shard_builder.text.TextKind`, or with ``--documents``
:class:`~shardstream.shard_builder.documents.DocumentKind`, in the builder's one pipeline:
fingerprint, journal, resume, index), and the pipeline's ordered workers are actors (the
one Ray driver, :mod:`.driver`):

1. actors tokenize chunks (a window of them ahead); each chunk's tokens (or encoded
   documents) stay in the object store of the actor's node, the driver gets the count
   (tokens; each document's size);
2. taking the counts in chunk order, the driver applies the kind's own cut (the one a
   local build applies): shard boundaries depend on the input order only, never on which
   worker finished first;
3. each shard is written and uploaded by the actor that holds most of its input (the rest
   comes from other nodes' object stores), which returns the shard's :class:`ShardInfo`;
4. the worker records the shard in the journal before it puts the shard in place, so a
   re-run after a kill (of the driver or of a node) continues after the last shard of the
   unbroken run and takes every later shard it finds recorded as it is (same position,
   same stream position after it) instead of writing it again.
"""

from __future__ import annotations

from typing import Any

from shardstream.errors import ConfigError
from shardstream.shard_builder.cluster.connect import RayOptions, ray_session
from shardstream.shard_builder.cluster.dataset import (
    is_url,
    text_source,
    text_url_source,
    tokenize_block,
)
from shardstream.shard_builder.cluster.driver import build_on_pool
from shardstream.shard_builder.config import TextBuildConfig
from shardstream.shard_builder.result import BuildResult
from shardstream.shard_builder.text import text_kind


def build_text_on_ray(
    config: TextBuildConfig,
    ray: RayOptions | None = None,
    *,
    dataset: Any = None,
    lineage: list[dict[str, Any]] | None = None,
) -> BuildResult:
    """:func:`~shardstream.shard_builder.build_text` with Ray workers: byte-identical output
    (with ``config.documents`` too: one sample per document, see :mod:`.documents`).

    The inputs are ``config.inputs`` (paths every node can read, or ``s3://`` URLs, which
    Ray Data reads), or ``dataset``: a ``ray.data.Dataset`` with a ``config.field`` text
    column, whose rows are the documents in order (``config.inputs`` then only names it;
    ``lineage`` describes its source for the fingerprint and ``shardstream.json``; not
    with ``config.documents``, whose inputs are files, a :class:`ConfigError` otherwise).
    ``config.workers`` is ignored; ``ray.workers`` (default: every CPU of the cluster) sets
    the number of worker actors. The result's ``workers`` holds each actor's numbers.

    Example::

        result = build_text_on_ray(
            TextBuildConfig(output="s3://bucket/corpus", inputs=("/shared/corpus",)),
            RayOptions(address="auto"),
        )
    """
    if config.skip_bad:
        raise ConfigError(
            "--skip-bad is not available with --ray yet: build without --ray, or fix or "
            "remove the bad lines (a build without --skip-bad names the first)"
        )
    url_inputs = any(is_url(name) for name in config.inputs)
    if config.documents and (dataset is not None or url_inputs):
        raise ConfigError(
            "--documents on Ray reads input files every node can read (a shared file "
            "system), as the local build does; s3:// inputs and Ray datasets are read for "
            "fixed-length builds only: copy the files to a shared path, or leave out "
            "--documents"
        )
    options = ray or RayOptions()
    with ray_session(options) as ray_module:
        source = None
        if dataset is not None:
            source = text_source(ray_module, dataset, config, lineage)
        elif url_inputs:
            source = text_url_source(ray_module, config)
        # A dataset's units are blocks in the object store: the actors read them there.
        work = tokenize_block if source is not None else None
        return build_on_pool(ray_module, config, options, lambda: text_kind(config, source), work)
