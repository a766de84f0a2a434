"""Reads: shard bytes into this process -- the only client package that calls storage.

- :mod:`.fetch` -- :class:`ShardFetcher`, the owner a batch stream talks to
- :mod:`.demand` -- the bytes the next batches need, fetched first and waited for
- :mod:`.fills` -- whole-shard downloads and ranged fills of the cache's download file
- :mod:`.partial` -- :class:`PartialShard`, a shard being filled block by block
- :mod:`.pieces` -- a cold process's first batches read as 64 KiB pieces
- :mod:`.memory` -- shards held in memory only (the cacheless mode, early reads)
- :mod:`.peers` -- blocks shared with the other processes of the node
- :mod:`.io`, :mod:`.ranges`, :mod:`.queue`, :mod:`.link`, :mod:`.refetch`,
  :mod:`.memory_need` -- block I/O and digests, byte ranges, the range queue, the link
  estimate, bounded refetches, the cacheless memory budget

Imports :mod:`shardstream.client.cache` and storage; never batches, workers or front ends.
"""
