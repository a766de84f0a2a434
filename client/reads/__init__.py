"""Reads: shard bytes into this process -- the only client package that calls storage.

The contract with the batch stream is exported here: :class:`ShardReads` (``start_pass``,
``want``, ``need``, ``close``), the :class:`ReadPass` it is given per pass, and its
counters, :class:`BlockStats`. The modules behind it:

- :mod:`.reads` -- :class:`ShardReads`, the one owner a batch stream talks to
- :mod:`.policy` -- pure: per shard whole / ranged / sparse / by piece, the cold-start rules
- :mod:`.read_state` -- :class:`~.read_state.SharedReads`, the state the owner's parts
  share; :mod:`.catalog` -- :class:`~.catalog.ShardCatalog`, the shards by global index;
  :mod:`.fill_states` -- :class:`~.fill_states.FillStates`, where each of this process's
  cache fills stands (``FillStage``: scheduled, running, complete, ended)
- :mod:`.demand` -- the bytes the next batches need, fetched first and waited for
- :mod:`.fills` -- whole-shard downloads and ranged fills of the cache's download file
- :mod:`.leases` -- shards leased from the node cache and opened; downloads ahead of them
- :mod:`.partial` -- :class:`~.partial.PartialShard`, a shard being filled block by block,
  with its :mod:`.blocks` (the ``BlockState`` of each block), :mod:`.requests`,
  :mod:`.header` and :mod:`.pieces` (a cold process's first batches read as 64 KiB pieces)
- :mod:`.memory` -- shards held in memory only (the cacheless mode, early reads)
- :mod:`.block_sources` -- where a partial's blocks come from: in place in the node's
  shared download file, another process's file, else the store
- :mod:`.peer_files` -- the node-wide folder of the processes' memory files and their
  block claims (byte-range locks)
- :mod:`.io`, :mod:`.ranges`, :mod:`.queue`, :mod:`.link`, :mod:`.refetch`,
  :mod:`.memory_need` -- block I/O and digests, byte ranges, the range queue, the link
  estimate, bounded refetches, the cacheless memory budget

Imports :mod:`shardstream.client.cache` and storage; never batches, workers or front ends.
"""

from shardstream.client.reads.io import BlockStats
from shardstream.client.reads.reads import ReadPass, ShardReads

__all__ = ["BlockStats", "ReadPass", "ShardReads"]
