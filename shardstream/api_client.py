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
backoff; every other HTTP error becomes the matching :mod:`shardstream.errors` class
(401 AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError,
422 RequestValidationError, unreachable/5xx ServerUnavailableError) carrying the server's
message. Responses with an ETag (published versions, their shard pages) are cached in
memory and revalidated with ``If-None-Match``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from shardstream.errors import (
    APIError,
    AuthenticationError,
    ConfigError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    RequestValidationError,
    ServerUnavailableError,
)
from shardstream.wire import (
    MAX_PRESIGN_KEYS,
    MAX_SHARDS_PER_BATCH,
    CheckpointCreate,
    CheckpointPublic,
    DatasetCreate,
    DatasetPublic,
    PresignRequest,
    PresignResponse,
    RunCreate,
    RunPublic,
    RunSource,
    RunStatus,
    RunUpdate,
    Scope,
    ShardBatch,
    ShardBatchResult,
    ShardRecord,
    TokenCreate,
    TokenPublic,
    VersionCreate,
    VersionPublic,
    VersionUpdate,
)

M = TypeVar("M", bound=BaseModel)

_ERRORS: dict[int, type[APIError]] = {
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: RequestValidationError,
}
_RETRY_STATUS = {502, 503, 504}
_MAX_CACHED = 4096


class APIClient:
    """A thread-safe client of the shardstream server's ``/v1`` API."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        base_url = base_url or os.environ.get("SHARDSTREAM_SERVER")
        if not base_url:
            raise ConfigError(
                "no server URL: pass base_url or set SHARDSTREAM_SERVER (e.g. http://127.0.0.1:8470)"
            )
        self.base_url = base_url.rstrip("/")
        token = token if token is not None else os.environ.get("SHARDSTREAM_TOKEN")
        headers = {"User-Agent": "shardstream-api-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self._retries = retries
        self._backoff_s = backoff_s
        self._etags: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    # -- plumbing --------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> APIClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (200, 201, 204),
    ) -> httpx.Response:
        """Send a request with retries; raise the mapped APIError for an error status."""
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        last: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                time.sleep(min(5.0, self._backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1))
            try:
                response = self._http.request(
                    method, path, json=json, params=clean, headers=headers
                )
            except httpx.TransportError as exc:
                last = exc
                continue
            if response.status_code in _RETRY_STATUS and attempt < self._retries:
                last = None
                continue
            if response.status_code in ok or response.status_code == 304:
                return response
            raise _error_from(method, path, response)
        where = f"{method} {self.base_url}{path}"
        raise ServerUnavailableError(
            f"{where}: the server did not answer after {self._retries + 1} attempts"
            + (f" ({type(last).__name__}: {last})" if last else "; check it is running"),
            0,
        ) from last

    def _get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        cache_key = path + "?" + "&".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
        with self._lock:
            cached = self._etags.get(cache_key)
        if cached is None:
            response = self.request("GET", path, params=params)
        else:
            response = self.request(
                "GET", path, params=params, headers={"If-None-Match": cached[0]}
            )
            if response.status_code == 304:
                return cached[1]
        body = response.json()
        etag = response.headers.get("etag")
        if etag:
            with self._lock:
                if len(self._etags) >= _MAX_CACHED:
                    self._etags.pop(next(iter(self._etags)))
                self._etags[cache_key] = (etag, body)
        return body

    def _model(self, model: type[M], response: httpx.Response) -> M:
        return model.model_validate(response.json())

    def _pages(
        self, path: str, model: type[M], *, limit: int, params: Mapping[str, Any] | None = None
    ) -> Iterator[M]:
        cursor: str | None = None
        while True:
            body = self._get_json(path, {**(params or {}), "cursor": cursor, "limit": limit})
            for item in body["items"]:
                yield model.model_validate(item)
            cursor = body.get("next_cursor")
            if not cursor:
                return

    # -- health ----------------------------------------------------------------------

    def healthz(self) -> bool:
        """Whether the server answers."""
        return self.request("GET", "/healthz").status_code == 200

    def whoami(self) -> dict[str, Any]:
        """The calling token's name, scope and dataset allow-list."""
        result: dict[str, Any] = self.request("GET", "/v1/whoami").json()
        return result

    # -- datasets --------------------------------------------------------------------

    def create_dataset(self, name: str, *, description: str = "", owner: str = "") -> DatasetPublic:
        """Create a dataset (ConflictError if it exists)."""
        body = DatasetCreate(name=name, description=description, owner=owner)
        return self._model(DatasetPublic, self.request("POST", "/v1/datasets", json=_dump(body)))

    def get_dataset(self, name: str) -> DatasetPublic:
        """One dataset."""
        return self._model(DatasetPublic, self.request("GET", f"/v1/datasets/{name}"))

    def ensure_dataset(self, name: str, *, description: str = "") -> DatasetPublic:
        """The dataset ``name``, created if missing (safe against a concurrent creator)."""
        try:
            return self.get_dataset(name)
        except NotFoundError:
            pass
        try:
            return self.create_dataset(name, description=description)
        except ConflictError:
            return self.get_dataset(name)

    def list_datasets(self, *, page_size: int = 100) -> Iterator[DatasetPublic]:
        """Every dataset the token may read, fetched a page at a time."""
        return self._pages("/v1/datasets", DatasetPublic, limit=page_size)

    def delete_dataset(self, name: str, *, force: bool = False) -> None:
        """Delete a dataset's metadata (ConflictError while a running run reads it)."""
        self.request("DELETE", f"/v1/datasets/{name}", params={"force": str(force).lower()})

    # -- versions --------------------------------------------------------------------

    def create_version(
        self,
        dataset: str,
        columns: Mapping[str, str],
        *,
        storage_root: str | None = None,
        builder_config: Mapping[str, Any] | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> VersionPublic:
        """Open a draft version of ``dataset``."""
        body = VersionCreate(
            columns=dict(columns),
            storage_root=storage_root,
            builder_config=dict(builder_config or {}),
            lineage=dict(lineage or {}),
        )
        path = f"/v1/datasets/{dataset}/versions"
        return self._model(VersionPublic, self.request("POST", path, json=_dump(body)))

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
        return self._model(VersionPublic, self.request("PATCH", path, json=_dump(body)))

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
            result = self._model(ShardBatchResult, self.request("POST", path, json=_dump(body)))
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
                self._model(PresignResponse, self.request("POST", path, json=_dump(body))).urls
            )
        return urls

    # -- runs and checkpoints --------------------------------------------------------

    def create_run(
        self,
        sources: Sequence[RunSource | tuple[str, int] | tuple[str, int, float]],
        *,
        global_batch_size: int,
        seed: int = 0,
        plan: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> RunPublic:
        """Register a run reading ``sources`` ((dataset, version[, weight]) or RunSource)."""
        srcs = [_source(s) for s in sources]
        body = RunCreate(
            name=name,
            sources=srcs,
            seed=seed,
            global_batch_size=global_batch_size,
            plan=dict(plan or {}),
        )
        return self._model(RunPublic, self.request("POST", "/v1/runs", json=_dump(body)))

    def get_run(self, run_id: int) -> RunPublic:
        """One run."""
        return self._model(RunPublic, self.request("GET", f"/v1/runs/{run_id}"))

    def list_runs(self, *, page_size: int = 100) -> Iterator[RunPublic]:
        """Every run the token may read."""
        return self._pages("/v1/runs", RunPublic, limit=page_size)

    def set_run_status(self, run_id: int, status: RunStatus | str) -> RunPublic:
        """Mark a run completed, failed, cancelled (or running again)."""
        body = RunUpdate(status=RunStatus(status))
        return self._model(RunPublic, self.request("PATCH", f"/v1/runs/{run_id}", json=_dump(body)))

    def commit_checkpoint(
        self,
        run_id: int,
        *,
        step: int,
        epoch: int,
        sample_in_epoch: int,
        plan: Mapping[str, Any] | None = None,
    ) -> CheckpointPublic:
        """Commit the data position at ``step`` (same state again is a no-op; else 409)."""
        body = CheckpointCreate(
            step=step, epoch=epoch, sample_in_epoch=sample_in_epoch, plan=dict(plan or {})
        )
        path = f"/v1/runs/{run_id}/checkpoints"
        return self._model(CheckpointPublic, self.request("POST", path, json=_dump(body)))

    def get_checkpoint(self, run_id: int, step: int) -> CheckpointPublic:
        """The checkpoint at ``step`` (NotFoundError if none)."""
        path = f"/v1/runs/{run_id}/checkpoints/{step}"
        return self._model(CheckpointPublic, self.request("GET", path))

    def latest_checkpoint(self, run_id: int) -> CheckpointPublic | None:
        """The newest checkpoint, or None when the run has none yet."""
        try:
            path = f"/v1/runs/{run_id}/checkpoints/latest"
            return self._model(CheckpointPublic, self.request("GET", path))
        except NotFoundError:
            self.get_run(run_id)  # a missing run is still an error
            return None

    def list_checkpoints(self, run_id: int, *, page_size: int = 100) -> Iterator[CheckpointPublic]:
        """A run's checkpoints by step."""
        return self._pages(f"/v1/runs/{run_id}/checkpoints", CheckpointPublic, limit=page_size)

    # -- tokens ----------------------------------------------------------------------

    def create_token(
        self,
        name: str,
        scopes: Sequence[Scope | str],
        *,
        datasets: Sequence[str] | None = None,
    ) -> TokenPublic:
        """Create a token (admin); ``.secret`` is only in this response."""
        body = TokenCreate(
            name=name,
            scopes=[Scope(s) for s in scopes],
            datasets=list(datasets) if datasets is not None else None,
        )
        return self._model(TokenPublic, self.request("POST", "/v1/tokens", json=_dump(body)))

    def list_tokens(self, *, page_size: int = 100) -> Iterator[TokenPublic]:
        """Every token's metadata (admin)."""
        return self._pages("/v1/tokens", TokenPublic, limit=page_size)

    def revoke_token(self, token_id: int) -> TokenPublic:
        """Revoke a token (admin)."""
        return self._model(TokenPublic, self.request("DELETE", f"/v1/tokens/{token_id}"))


def _source(spec: RunSource | tuple[str, int] | tuple[str, int, float]) -> RunSource:
    if isinstance(spec, RunSource):
        return spec
    weight = float(spec[2]) if len(spec) > 2 else 1.0
    return RunSource(dataset=spec[0], version=spec[1], weight=weight)


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json", exclude_none=False)


def _error_from(method: str, path: str, response: httpx.Response) -> APIError:
    try:
        detail = str(response.json().get("detail", "")) or response.text
    except ValueError:
        detail = response.text[:500]
    status = response.status_code
    cls = _ERRORS.get(status, ServerUnavailableError if status >= 500 else APIError)
    return cls(f"{method} {path}: {status} {detail}", status)


__all__ = ["APIClient"]
