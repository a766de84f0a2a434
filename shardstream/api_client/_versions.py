"""The version, shard-index and presign methods of :class:`~shardstream.api_client.APIClient`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardstream.errors import ConfigError
from shardstream.wire import (
    MAX_PRESIGN_KEYS,
    MAX_SHARDS_PER_BATCH,
    PresignRequest,
    PresignResponse,
    ShardBatch,
    ShardBatchResult,
    ShardRecord,
    VersionCreate,
    VersionPublic,
    VersionUpdate,
)

from ._session import APISession, json_body


class VersionsAPI(APISession):
    """A version's lifecycle (draft, shards, publish or abort) and its published index."""

    def create_version(
        self,
        dataset: str,
        columns: Mapping[str, str],
        *,
        storage_root: str | None = None,
        builder_config: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> VersionPublic:
        """Open a draft version of ``dataset``.

        The request carries an ``Idempotency-Key`` (``idempotency_key``, else a fresh
        uuid4) that its retries repeat, so a retry after a lost answer gets the draft the
        first attempt created instead of a second one. Pass your own key to make a call
        that is itself repeated (a restarted job) return the same draft.
        """
        body = VersionCreate(
            columns=dict(columns),
            storage_root=storage_root,
            builder_config=dict(builder_config or {}),
            lineage=dict(lineage or {}),
        )
        path = f"/v1/datasets/{dataset}/versions"
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        response = self.request("POST", path, json=json_body(body), headers=headers)
        return self._model(VersionPublic, response)

    def update_version(
        self,
        dataset: str,
        number: int,
        *,
        columns: Mapping[str, str] | None = None,
        storage_root: str | None = None,
        builder_config: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> VersionPublic:
        """Fill in a draft (columns, storage root before any shard, config, lineage)."""
        body = VersionUpdate(
            columns=dict(columns) if columns is not None else None,
            storage_root=storage_root,
            builder_config=dict(builder_config) if builder_config is not None else None,
            lineage=dict(lineage) if lineage is not None else None,
        )
        path = f"/v1/datasets/{dataset}/versions/{number}"
        return self._model(VersionPublic, self.request("PATCH", path, json=json_body(body)))

    def get_version(self, dataset: str, number: int) -> VersionPublic:
        """One version (published ones are cached and revalidated by ETag)."""
        return VersionPublic.model_validate(
            self._get_json(f"/v1/datasets/{dataset}/versions/{number}")
        )

    def latest_version(self, dataset: str) -> VersionPublic:
        """The newest published version of ``dataset``."""
        path = f"/v1/datasets/{dataset}/versions/latest"
        return self._model(VersionPublic, self.request("GET", path))

    def list_versions(self, dataset: str, *, page_size: int = 100) -> Iterator[VersionPublic]:
        """Every version of ``dataset``, by number."""
        return self._pages(f"/v1/datasets/{dataset}/versions", VersionPublic, limit=page_size)

    def add_shards(
        self, dataset: str, number: int, shards: Sequence[ShardRecord]
    ) -> ShardBatchResult:
        """Register shards with a draft, in batches of at most 5,000."""
        result: ShardBatchResult | None = None
        path = f"/v1/datasets/{dataset}/versions/{number}/shards"
        for start in range(0, len(shards), MAX_SHARDS_PER_BATCH):
            body = ShardBatch(shards=list(shards[start : start + MAX_SHARDS_PER_BATCH]))
            result = self._model(ShardBatchResult, self.request("POST", path, json=json_body(body)))
        if result is None:
            raise ConfigError("add_shards needs at least one shard")
        return result

    def publish_version(self, dataset: str, number: int) -> VersionPublic:
        """Publish a draft (the server checks every shard in storage first)."""
        path = f"/v1/datasets/{dataset}/versions/{number}/publish"
        return self._model(VersionPublic, self.request("POST", path))

    def abort_version(self, dataset: str, number: int) -> VersionPublic:
        """Abort a draft."""
        path = f"/v1/datasets/{dataset}/versions/{number}/abort"
        return self._model(VersionPublic, self.request("POST", path))

    def iter_shards(
        self, dataset: str, number: int, *, page_size: int = 1000
    ) -> Iterator[ShardRecord]:
        """A version's shard index in order, a page at a time."""
        path = f"/v1/datasets/{dataset}/versions/{number}/shards"
        return self._pages(path, ShardRecord, limit=page_size)

    def iter_shard_pages(
        self, dataset: str, number: int, *, page_size: int = 10_000
    ) -> Iterator[list[dict[str, Any]]]:
        """A version's shard index as pages of plain dicts, unvalidated and uncached: for
        readers of large indexes that keep the data themselves (``ShardRecord`` fields)."""
        path = f"/v1/datasets/{dataset}/versions/{number}/shards"
        return self._raw_pages(path, limit=page_size, cache=False)

    def index_json(self, dataset: str, number: int) -> bytes:
        """A published version's MDS ``index.json`` bytes."""
        path = f"/v1/datasets/{dataset}/versions/{number}/index.json"
        return self.request("GET", path).content

    def presign(
        self, dataset: str, number: int, keys: Sequence[str], *, expires_s: int | None = None
    ) -> dict[str, str]:
        """Short-lived GET URLs for shard keys (any number; sent in batches of 1,000)."""
        urls: dict[str, str] = {}
        path = f"/v1/datasets/{dataset}/versions/{number}/presign"
        for start in range(0, len(keys), MAX_PRESIGN_KEYS):
            body = PresignRequest(
                keys=list(keys[start : start + MAX_PRESIGN_KEYS]), expires_s=expires_s
            )
            urls.update(
                self._model(PresignResponse, self.request("POST", path, json=json_body(body))).urls
            )
        return urls
