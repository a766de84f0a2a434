"""Workers: the fast loader's processes and the shared-memory ring they fill.

- :mod:`.pool` -- the parent side: fork, deferred start, receive, slot loans, stop
- :mod:`.worker` -- a worker process's loop: a :class:`~.batches.stream.BatchStream`
  building batches into ring slots
- :mod:`.ring` -- the ring of shared-memory batch slots lent between processes

Used by :mod:`shardstream.client.loader`; imports :mod:`~shardstream.client.batches` and below.
"""
