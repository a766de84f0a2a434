"""The one HTTP client of the metadata server, shared by the builder and the client SDK.

::

    from shardstream.api_client import APIClient

    with APIClient("http://127.0.0.1:8470", token="ss_...") as api:  # or the environment
        version = api.latest_version("wiki")
        for shard in api.iter_shards("wiki", version.number):
            ...
        api.commit_checkpoint(run_id, step=100, epoch=0, sample_in_epoch=25_600)

``base_url`` defaults to ``SHARDSTREAM_SERVER`` and ``token`` to ``SHARDSTREAM_TOKEN``.
Connection errors, timeouts and 502/503/504 answers are retried with jittered exponential
backoff, and 429 (a token over the server's per-token budget) after its ``Retry-After``,
under the project's one :class:`~shardstream.retry.RetryPolicy` (``retries=``/``backoff_s=``
set it, or ``retry=`` gives a whole one; ``with_retry`` shares the pool under another);
every other HTTP error becomes the matching :mod:`shardstream.errors` class
(401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError,
422 RequestValidationError, unreachable/5xx ServerUnavailableError) carrying the server's
message. Responses with an ETag (published versions, their shard pages) are cached in
memory and revalidated with ``If-None-Match``.

The transport core (retries, error translation, the ETag cache) is ``_session``; each
resource's methods are a small class of their own (``_datasets``, ``_versions``, ``_runs``,
``_tokens``) that :class:`APIClient` joins into one.
"""

from __future__ import annotations

from ._client import APIClient

__all__ = ["APIClient"]
