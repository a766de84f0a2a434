"""The node-local disk cache: one download per shard per node, LRU within a size limit.

- :mod:`.shard_cache` -- :class:`ShardCache`: pinning, leases, eviction, the download file
- :mod:`.layout` -- :class:`CacheLayout`: where the cache keeps its files (the one place)
- :mod:`.keys` -- a shard key's flat file name
- :mod:`.space` -- the size limit and eviction across processes
- :mod:`.lease` -- leases that keep a shard in place while a process reads it
- :mod:`.verify` -- proof that a cached file holds its bytes
- :mod:`.filelock`, :mod:`.private_paths` -- file locks, and folders only this user owns

Imports nothing from the rest of the client.
"""
