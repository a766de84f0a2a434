"""Where a dataset's bytes live, as the server sees it: the configured storage roots and
each dataset's server-derived location under one of them (:mod:`.locations`), and the
stores it opens there to check shards before a publish and to presign them
(:mod:`.stores`). The object stores themselves are the shared core's
(:mod:`shardstream.storage`)."""
