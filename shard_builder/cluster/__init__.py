"""Building on a Ray cluster: the local builder's output, made by Ray workers.

Worker actors (one per CPU, the tokenizer loaded once each) tokenize or check the input's
chunks, write the shards and upload them straight to the output; the driver cuts the
stream from the workers' counts, keeps the journal and writes the index: only metadata
passes through it. The shards and ``index.json`` are byte-identical to
:func:`~shardstream.shard_builder.build_text` / ``build_images`` for the same inputs and
options, whatever the number of workers or nodes, and a build killed anywhere (driver or
node) resumes from its journal like a local one. Ray is the ``[ray]`` extra, imported only
when a build asks for it::

    from shardstream.shard_builder import TextBuildConfig
    from shardstream.shard_builder.cluster import RayOptions, build_text_on_ray

    result = build_text_on_ray(
        TextBuildConfig(output="s3://bucket/corpus", inputs=("/shared/corpus",)),
        RayOptions(address="auto"),
    )
    for worker in result.workers:
        print(worker.line(result.kind, result.timings["total_s"]))

From the command line: ``shardstream build text|images ... --ray ADDRESS``. See
``docs/building.md``, "Building on a Ray cluster".
"""

from shardstream.shard_builder.cluster.connect import RayOptions
from shardstream.shard_builder.cluster.images import build_images_on_ray
from shardstream.shard_builder.cluster.text import build_text_on_ray

__all__ = ["RayOptions", "build_images_on_ray", "build_text_on_ray"]
