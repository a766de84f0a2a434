"""Sources: a dataset pinned to one version, with its shard index.

- :mod:`.source` -- :class:`ResolvedSource` (an ``index.json`` URL or a named dataset, pinned)
- :mod:`.named` -- a dataset named on the metadata server, resolved to a published version
- :mod:`.index_cache` -- the node-local copy of a server's shard index (one download per node)

May use :mod:`shardstream.client.cache` and storage; knows nothing of batches or reads.
"""
