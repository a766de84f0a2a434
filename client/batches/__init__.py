"""Batches: plan positions -> tensors, in one process.

- :mod:`.stream` -- :class:`BatchStream`, the plan walked for one rank/worker, asking
  :mod:`shardstream.client.reads` for the shards' bytes
- :mod:`.batch`, :mod:`.decode` -- samples decoded and stacked into a batch
- :mod:`.packing`, :mod:`.packed` -- documents packed into fixed-length rows at read time
- :mod:`.sample_transform`, :mod:`.image_decode`, :mod:`.image_augment`, :mod:`.image_stage`
  -- per-sample transforms, JPEG decoding, and the device-side image stage
- :mod:`.footprint` -- how much node cache the readers hold at once
- :mod:`.input_stats` -- how long the training loop waited for input, and why

Imports :mod:`~shardstream.client.reads`, :mod:`~shardstream.client.cache` and ``plan``; never
the front ends or :mod:`~shardstream.client.workers`.
"""
