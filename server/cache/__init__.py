"""What one server process keeps in memory so a starting job's thousand ranks cost one
query: published versions, their index pages and presigned URLs (:mod:`.published`),
and concurrent misses collapsed into one lookup (:mod:`.singleflight`). HTTP caching
headers are the API's (:mod:`shardstream.server.api.caching`)."""
