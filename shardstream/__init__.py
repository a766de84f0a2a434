"""shardstream: upload a training dataset once, stream it to many nodes, resume exactly.

The distribution has three parts that share the code in this package:

* :mod:`shardstream.shard_builder` turns raw data into MDS shards and publishes versions,
* :mod:`shardstream.server` is the metadata service,
* :mod:`shardstream.client` is the SDK on training nodes.

Shared pieces live here: :mod:`shardstream.errors` (the exception tree),
:mod:`shardstream.mds` (the shard codec) and :mod:`shardstream.storage` (object stores).
"""

from shardstream.errors import ShardstreamError

__version__ = "0.1.0"

__all__ = ["ShardstreamError", "__version__"]
