"""shardstream.shard_builder: turn raw data into MDS shards, locally or in object storage.

Two builds, each a frozen config and one function::

    from shardstream.shard_builder import TextBuildConfig, build_text
    result = build_text(TextBuildConfig(output="s3://bucket/corpus", inputs=("docs/",)))

    from shardstream.shard_builder import ImageBuildConfig, build_images
    result = build_images(ImageBuildConfig(output="out/imagenet", inputs=("train/",)))

Both use every core, write byte-identical output for the same inputs and options whatever
the worker count, resume a killed build from its last finished shard, and write
``index.json`` last. The same builds run from the command line as ``shardstream build
text|images``, and on a Ray cluster with ``--ray`` (:mod:`.cluster`, the ``[ray]`` extra:
byte-identical output). See ``docs/building.md``.
"""

from shardstream.shard_builder.config import ImageBuildConfig, OutputOptions, TextBuildConfig
from shardstream.shard_builder.images import build_images
from shardstream.shard_builder.result import BadInput, BuildResult
from shardstream.shard_builder.text import build_text

__all__ = [
    "BadInput",
    "BuildResult",
    "ImageBuildConfig",
    "OutputOptions",
    "TextBuildConfig",
    "build_images",
    "build_text",
]
