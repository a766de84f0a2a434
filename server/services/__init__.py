"""The server's use cases, callable without HTTP: publish a version, serve its index,
presign its shards, commit a checkpoint, register an attempt.

Layers (docs/architecture.md): ``api/routes`` parse a request, call one function here
and answer; these functions sequence the data layer (``data/``, where every query
lives), storage and the metrics, and raise :mod:`shardstream.errors` exceptions that the
app's handlers translate; they never see a request or a response. What they need of the
running server is passed in explicitly (:class:`~.parts.ServerParts`, or a session whose
transaction the caller owns), so a test, a script or another front end calls them as the
routes do.
"""
