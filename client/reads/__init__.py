"""Reads: shard bytes into this process -- the only client package that calls storage.

- :mod:`.reads` -- :class:`ShardReads`, the one owner a batch stream talks to
  (``start_pass``, ``want``, ``need``, ``close``)
- :mod:`.policy` -- pure: per shard whole / ranged / sparse / by piece, the cold-start rules
- :mod:`.shared` -- :class:`SharedReads`, the state the owner's parts share, and its lock
- :mod:`.demand` -- the bytes the next batches need, fetched first and waited for
- :mod:`.fills` -- whole-shard downloads and ranged fills of the cache's download file
- :mod:`.leases` -- shards leased from the node cache and opened; downloads ahead of them
- :mod:`.partial` -- :class:`PartialShard`, a shard being filled block by block, with its
  :mod:`.blocks` (the ``BlockState`` of each block), :mod:`.header` and :mod:`.pieces`
  (a cold process's first batches read as 64 KiB pieces)
- :mod:`.memory` -- shards held in memory only (the cacheless mode, early reads)
- :mod:`.peers`, :mod:`.sharing` -- blocks shared with the other processes of the node
- :mod:`.io`, :mod:`.ranges`, :mod:`.queue`, :mod:`.link`, :mod:`.refetch`,
  :mod:`.memory_need` -- block I/O and digests, byte ranges, the range queue, the link
  estimate, bounded refetches, the cacheless memory budget

Imports :mod:`shardstream.client.cache` and storage; never batches, workers or front ends.
"""
